//go:build !race

// Members in one process make protoactor report data races inside itself
// (grpclog, member list, endpoint manager) under -race; .ci/run runs these
// tests without it, in a step of their own.

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
)

// TestOneBatcherPerDestination: deliveries from every member to a
// destination are all sent by one member's codec, in batches that mix the
// members' deliveries.
func TestOneBatcherPerDestination(t *testing.T) {
	dests := names(6)
	ms := startTestCluster(t, 3, dests, memberOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const perMember = 30
	var wg sync.WaitGroup
	errs := make(chan error, len(ms)*len(dests)*perMember)
	for mi, m := range ms {
		for _, d := range dests {
			for i := range perMember {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id, err := m.node.Deliver(ctx, d, codec.Message{Body: []byte(fmt.Sprintf("%d-%d", mi, i))})
					if err == nil && id == "" {
						err = fmt.Errorf("empty id")
					}
					errs <- err
				}()
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	owners := map[int]int{}
	for _, d := range dests {
		senders := 0
		for mi, m := range ms {
			if n := len(m.fake(d).Sent()); n > 0 {
				senders++
				owners[mi]++
				assert.Equal(t, len(ms)*perMember, n, "destination %s: member %d sent a part", d, mi)
			}
		}
		assert.Equal(t, 1, senders, "destination %s was sent by %d members", d, senders)
	}
	t.Logf("destinations per owner: %v", owners)
}
