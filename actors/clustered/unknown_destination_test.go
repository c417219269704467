//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
)

// A member that owns a name it does not know (a rolling deploy that adds a
// destination reaches the members one at a time) answers a delivery to it
// ErrUnknownDestination at once, as the package doc says. Before, its grain
// yielded as if it did not own the name, the caller looked the owner up
// again, found the same member, and went round until its deadline: the
// delivery took the caller's whole deadline and ended ErrUnreachable
// (ambiguous: "it may have been sent"). The names the member does know,
// and the other member owns, still work.
func TestOwnerWithoutTheNameAnswersUnknown(t *testing.T) {
	pool := names(16)
	agent := test.NewInMemAgent()
	provider := func() memberOpts {
		return memberOpts{noCleanup: true, provider: test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))}
	}
	knows := startMember(t, pool, provider())
	lacks := startMember(t, []string{"common"}, provider())
	ms := []*member{knows, lacks}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)

	unknown, known := 0, 0
	for _, name := range pool {
		owner, _ := ownerOf(t, ms, name)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		_, err := knows.node.Deliver(ctx, name, codec.Message{Body: []byte(name)})
		took := time.Since(start)
		cancel()
		if owner == knows {
			known++
			assert.NoError(t, err, "%s, owned by the member that knows it", name)
			continue
		}
		unknown++
		require.ErrorIs(t, err, clustered.ErrUnknownDestination, "%s, owned by the member that lacks it, after %v", name, took)
		assert.True(t, codec.IsPermanent(err), "%s: %v", name, err)
		assert.Less(t, took, 2*time.Second, "%s: the answer took most of the caller's deadline", name)
	}
	require.Positive(t, unknown, "the member that lacks the names owns none of them")
	require.Positive(t, known, "the member that knows the names owns none of them")
	t.Logf("%d names owned by the member that lacks them, %d by the one that knows them", unknown, known)
}
