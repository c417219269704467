//go:build !race

package clustered_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A delivery that waits in the buffer of a new owner's grain (the grain
// waits for the old owner's hand-off) and whose caller, on a third member,
// cancels meanwhile is not sent once the grain admits: its cancel is kept
// until the delivery is admitted, which then finds it. A delivery of the
// same caller's member that was not cancelled is sent, after the old
// owner's request ended.
func TestACancelReachesADeliveryBufferedForAHandoff(t *testing.T) {
	const hold = 3 * time.Second // the old owner's request in flight
	var mu sync.Mutex
	sentAt := map[string]time.Time{} // each body's request end, at every member
	newCodec := func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: time.Millisecond}
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			for _, m := range batch {
				if string(m.Body) == "blocker" {
					select {
					case <-time.After(hold):
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				sentAt[string(m.Body)] = time.Now()
			}
			return make([]codec.Result, len(batch)), nil
		}
		return c
	}
	pool := names(32)
	c := newManaged(t, 3)
	moving := c.moves(pool, 1, 0, []int{0, 2}, 1, []int{0, 1, 2})
	require.NotEmpty(t, moving, "no destination moves from slot 0 to slot 1")
	dest := moving[0]
	o := memberOpts{codec: newCodec}
	old, caller := c.start(t, 0, pool, o), c.start(t, 2, pool, o)
	ms := []*member{old, caller}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)

	deliver := func(m *member, body string, cancelAfter time.Duration) <-chan error {
		return deliverAsync(m, dest, body, 4*hold, cancelAfter)
	}
	// The caller's member knows the old owner's grain: its deliveries
	// after the join find the new one as they would in a running cluster.
	require.NoError(t, <-deliver(caller, "warm-up", 0))
	blocker := deliver(old, "blocker", 0)
	require.Eventually(t, func() bool { return old.fake(dest).Requests() >= 2 }, hold/2, 5*time.Millisecond, "the blocker is not in flight")
	blocked := time.Now()

	newOwner := c.start(t, 1, pool, o)
	ms = append(ms, newOwner)
	waitMembers(t, ms, 3)
	require.Less(t, time.Since(blocked), hold/2, "the join took too long for the test")

	cancelled := deliver(caller, "cancelled", 300*time.Millisecond)
	kept := deliver(caller, "kept", 0)
	err := <-cancelled
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, clustered.ErrUnreachable)
	cancelledAt := time.Now()
	require.NoError(t, <-blocker)
	require.NoError(t, <-kept)

	mu.Lock()
	got := maps.Clone(sentAt)
	mu.Unlock()
	// The test drove what it means to: the grain buffered both while the
	// old owner's request was in flight, and the cancel came before.
	assert.True(t, cancelledAt.Before(got["blocker"]), "the caller cancelled after the hand-off")
	assert.False(t, got["kept"].Before(got["blocker"]), "the new owner sent before the old one handed off")
	assert.Contains(t, got, "kept")
	assert.NotContains(t, got, "cancelled", "a delivery cancelled while buffered was sent")
	for _, m := range ms {
		for _, s := range m.fake(dest).Sent() {
			assert.NotEqual(t, "cancelled", string(s.Body), "a delivery cancelled while buffered was sent")
		}
	}
	assert.Positive(t, len(newOwner.fake(dest).Sent()), "the new owner sent nothing")
	assert.Eventually(t, func() bool { return newOwner.node.CancelsKept() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the new owner keeps the cancel of a delivery it dropped")
}
