//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
)

// TestOwnersCallersAdmitDirectly: once the owner's grain admits, the
// owner's own callers hand their deliveries to its instance directly (one
// call each, no batch message to the grain), and are answered with their
// own results; a newer topology closes that until the grain, reached the
// long way, finds its member still owns the destination; Leave closes it
// for good.
func TestOwnersCallersAdmitDirectly(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"d"}, memberOpts{})
	owner, other := ownerOf(t, ms, "d")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := func(s string) codec.Message { return codec.Message{Body: []byte(s)} }

	assert.False(t, owner.node.OpenHere("d"), "no grain yet")
	_, err := other.node.Deliver(ctx, "d", msg("activates the grain"))
	require.NoError(t, err)
	require.True(t, owner.node.OpenHere("d"), "the admitting grain opens the destination to its member's callers")

	const n = 50
	before := owner.node.Calls()
	ids := map[string]bool{}
	for i := range n {
		id, err := owner.node.Deliver(ctx, "d", msg("direct"))
		require.NoError(t, err, "delivery %d", i)
		ids[id] = true
	}
	assert.Equal(t, uint32(n), owner.node.Calls()-before, "one call per delivery: none went through the grain")
	assert.Len(t, ids, n, "each caller gets its own message's id")
	assert.Len(t, owner.fake("d").Sent(), n+1, "all sent by the owner's batcher")

	owner.node.NewTopologyVersion()
	assert.False(t, owner.node.OpenHere("d"), "opened in an older topology")
	before = owner.node.Calls()
	_, err = owner.node.Deliver(ctx, "d", msg("the long way"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, owner.node.Calls()-before, uint32(2), "through the grain: a call and a batch message")
	assert.True(t, owner.node.OpenHere("d"), "the grain, still the owner's, opens it again")

	owner.leave(t)
	assert.False(t, owner.node.OpenHere("d"), "Leave closes it")
}
