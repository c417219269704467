package actors_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// With StrictGroups, a grouped message without an IdempotencyKey is
// refused at once with a permanent error naming the field: its group could
// not know its retry, and would wait GroupPauseMax after any failure.
// Ungrouped messages need no key.
func TestStrictGroupsRefuseAGroupedMessageWithoutAKey(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "strict-keyless"})
	c := fakecodec.New("strict-keyless", lim10)
	c.Tune = codec.Tuning{StrictGroups: true, Linger: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Tenant: "t", Group: "g", Body: []byte("x")})
	require.ErrorIs(t, err, messages.ErrNoIdempotencyKey)
	assert.True(t, codec.IsPermanent(err))
	assert.Contains(t, err.Error(), "IdempotencyKey")
	_, err = inst.Deliver(ctx, c, codec.Message{Tenant: "t", Body: []byte("y")})
	assert.NoError(t, err, "an ungrouped message needs no key")
	_, err = inst.Deliver(ctx, c, codec.Message{Tenant: "t", Group: "g", IdempotencyKey: "k", Body: []byte("z")})
	assert.NoError(t, err)
}

// WhenFull Block: a queued caller that cancels frees its room at once, and
// the delivery waiting for that room is admitted then, not at its own
// deadline (the cancel reaches the batcher as an event).
func TestBlockACancelledCallersRoomGoesToTheWaiterAtOnce(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "block-cancel"})
	c, v := valved("block-cancel", lim10, codec.Tuning{WhenFull: codec.Block, QueueMax: 2, MaxEntries: 1, MaxInflight: 1, Linger: time.Millisecond})
	defer v.Open()
	slow := deliverAsync(inst, c, msg("t", "", "slow"), 30*time.Second)
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)

	ctx1, cancel1 := context.WithCancel(context.Background())
	q1 := make(chan error, 1)
	go func() { _, err := inst.Deliver(ctx1, c, msg("t", "", "q1")); q1 <- err }()
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)
	q2 := deliverAsync(inst, c, msg("t", "", "q2"), 30*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond)
	w := deliverAsync(inst, c, msg("u", "", "w"), 30*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)

	cancel1()
	require.ErrorIs(t, <-q1, context.Canceled)
	// Nothing else happens meanwhile: only the cancel can admit w.
	require.Eventually(t, func() bool {
		s := inst.Stats()
		return s.Waiting == 0 && s.Queued == 2
	}, 2*time.Second, time.Millisecond, "the waiter took the cancelled caller's room")
	v.Open()
	for _, ch := range []<-chan result{slow, q2, w} {
		assert.NoError(t, await(t, ch).err)
	}
}

// A GroupPausedError suggests how long to wait before delivering again,
// as a RetryAfterError does, so that held callers do not spin.
func TestGroupPausedErrorSuggestsAWait(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "strict-after"})
	c := flakyStrictCodec("strict-after", 0)
	c.Tune.RetryAfterMax = 50 * time.Millisecond
	_, err := deliverWithin(inst, c, "g", "k1", "fail-1")
	require.Error(t, err)
	_, err = deliverWithin(inst, c, "g", "k2", "ok-2")
	var gp *messages.GroupPausedError
	require.True(t, errors.As(err, &gp), "%v", err)
	assert.Equal(t, "k1", gp.Key)
	assert.Positive(t, gp.After)
	assert.LessOrEqual(t, gp.After, 50*time.Millisecond)
}
