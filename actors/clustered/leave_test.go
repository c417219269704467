//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// Leave waits for the deliveries this member's callers have in progress.
// One of them may be held by the member's own grain of a destination the
// member owns, waiting for the old owner's hand-off: Leave refuses it "not
// the owner", and the topology still names the member itself until Leave
// is done. That caller's message was never admitted; it must be answered,
// not bounce on its own member until its deadline while Leave waits for it
// until Leave's ctx ends.
func TestLeaveAnswersItsOwnCallerWaitingForAHandOff(t *testing.T) {
	agent := test.NewInMemAgent()
	provider := func() memberOpts {
		return memberOpts{noCleanup: true, provider: test.NewTestProvider(agent,
			test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))}
	}
	pool := names(24)
	// The first member owns every destination while alone; its requests
	// wait for release, so it holds what it admitted.
	release := make(chan struct{})
	oldOpts := provider()
	oldOpts.codec = func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return make([]codec.Result, len(batch)), nil
		}
		return c
	}
	old := startMember(t, pool, oldOpts)
	ms := []*member{old}
	t.Cleanup(func() {
		close(release)
		// protoactor's graceful shutdown of a member that saw another
		// leave takes about 10 s here; the node's own part is quick.
		for _, m := range ms {
			if m.gone {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			assert.NoError(t, m.node.Leave(ctx))
			assert.NoError(t, m.inst.Stop(ctx))
			cancel()
		}
	})
	waitMembers(t, ms, 1)
	held := make(chan error, len(pool))
	for _, d := range pool {
		go func() {
			_, err := old.node.Deliver(context.Background(), d, codec.Message{Body: []byte("held")})
			held <- err
		}()
	}
	require.Eventually(t, func() bool { return old.inst.Stats().InFlight == len(pool) }, 10*time.Second, time.Millisecond)

	// A second member joins; it owns some destinations now, whose
	// hand-off waits for the first member's requests.
	joiner := startMember(t, pool, provider())
	ms = append(ms, joiner)
	waitMembers(t, ms, 2)
	var dest string
	for _, d := range pool {
		if owner, _ := ownerOf(t, ms, d); owner == joiner {
			dest = d
			break
		}
	}
	require.NotEmpty(t, dest)
	caller := make(chan error, 1)
	go func() {
		// A deadline past Leave's.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := joiner.node.Deliver(ctx, dest, codec.Message{Body: []byte("waits for the hand-off")})
		caller <- err
	}()
	select {
	case err := <-caller:
		t.Fatalf("the delivery did not wait for the hand-off: %v", err)
	case <-time.After(300 * time.Millisecond):
		// It waits in the joiner's grain (or bounces until the grain
		// runs); either way it is in progress and was not admitted.
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	err := joiner.node.Leave(ctx)
	took := time.Since(start)
	joiner.gone = true
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	assert.NoError(t, joiner.inst.Stop(stopCtx))
	require.NoError(t, err, "Leave waited for its own caller until its ctx ended (%v)", took)
	err = <-caller
	assert.ErrorIs(t, err, messages.ErrStopped, "the message was never admitted")
	assert.Empty(t, joiner.fake(dest).Sent(), "the joiner never admitted it")
}
