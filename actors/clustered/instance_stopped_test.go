//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// A member's instance stopped before its node left (the wrong order, or
// another part of the service stopping it): every delivery to a
// destination that member owns, from any member, is answered
// messages.ErrStopped at once (never sent, so safe to try again), every
// other delivery is sent, nobody waits for a deadline, and Leave still
// hands the destinations off, after which they are served again.
func TestInstanceStoppedBeforeLeave(t *testing.T) {
	const dests, callers, each = 6, 40, 10
	ms := startTestCluster(t, 2, names(dests), memberOpts{codec: func(name string) codec.Codec { return benchCodec(name, 50*time.Millisecond) }})
	owner, other := ownerOf(t, ms, "dest-0")
	ownedByOwner := map[string]bool{}
	for d := range dests {
		o, _ := ownerOf(t, ms, fmt.Sprintf("dest-%d", d))
		ownedByOwner[fmt.Sprintf("dest-%d", d)] = o == owner
	}
	const deadline = 8 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	type result struct {
		dest string
		err  error
		took time.Duration
	}
	results := make(chan result, 2*callers*each)
	var wg sync.WaitGroup
	for i := range callers {
		for _, m := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range each {
					d := fmt.Sprintf("dest-%d", (i+j)%dests)
					start := time.Now()
					_, err := m.node.Deliver(ctx, d, codec.Message{Body: []byte("x")})
					results <- result{d, err, time.Since(start)}
				}
			}()
		}
	}
	time.Sleep(100 * time.Millisecond)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer stopCancel()
	require.NoError(t, owner.inst.Stop(stopCtx))
	wg.Wait()
	close(results)
	stopped := 0
	for r := range results {
		// Far below the deadline: only a caller left waiting fails it.
		assert.Less(t, r.took, deadline/2, "%s waited for its deadline", r.dest)
		if r.err == nil {
			continue
		}
		require.ErrorIs(t, r.err, messages.ErrStopped, "%s", r.dest)
		assert.True(t, ownedByOwner[r.dest], "%s, owned by the member whose instance runs, was answered %v", r.dest, r.err)
		assert.False(t, codec.IsPermanent(r.err))
		stopped++
	}
	assert.Positive(t, stopped, "the instance stopped after every delivery was answered: the test proved nothing")
	leaveCtx, leaveCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer leaveCancel()
	require.NoError(t, owner.node.Leave(leaveCtx))
	owner.gone = true
	_, err := other.node.Deliver(ctx, "dest-0", codec.Message{Body: []byte("after")})
	require.NoError(t, err, "the destination is served again once its owner left")
}
