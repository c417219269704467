package chaos_test

// Deterministic reproductions, through the public API with a fake codec, of
// two queue faults TestChaosSoak found (fixed in 81f5a0f, which FuzzQueue
// found as well).

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// startQuiet runs an instance for one test; its cleanup stops it and checks
// that Stop leaves nothing behind.
func startQuiet(t *testing.T, name string, logs slog.Handler) *actors.Instance {
	t.Helper()
	if logs == nil {
		logs = slog.NewTextHandler(io.Discard, nil)
	}
	_, inst := testinst.Start(t, actors.Config{Name: name, Logger: slog.New(logs)})
	return inst
}

// deliverInOrder starts a Deliver of body with its own timeout and waits
// until the batcher has queued it, so that deliveries queue in call order.
func deliverInOrder(t *testing.T, inst *actors.Instance, c codec.Codec, group, body string, timeout time.Duration, queued int) <-chan error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := inst.Deliver(ctx, c, codec.Message{Tenant: "t", Group: group, Body: []byte(body)})
		ch <- err
	}()
	require.Eventually(t, func() bool { return inst.Stats().Queued == queued }, 5*time.Second, time.Millisecond, "%s is queued", body)
	return ch
}

func recv(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("no answer within 15s")
		return nil
	}
}

// A lane [b, c, d] in which c expired first (removed from the middle) and b
// expires next: removing b lets the lane's head skip b and c at once, and the
// sweep must not then read the slot it just cleared. Seen in the soak as
// "batcher crashed ... nil pointer dereference" in queue.sweep, after which
// the entries that sweep had already removed were never answered.
func TestSweepPastADeadEntryKeepsTheBatcherUp(t *testing.T) {
	logs := &logCounter{}
	inst := startQuiet(t, "sweep", logs)
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Second}
	b := deliverInOrder(t, inst, c, "", "b", 300*time.Millisecond, 1)
	cc := deliverInOrder(t, inst, c, "", "c", 150*time.Millisecond, 2)
	d := deliverInOrder(t, inst, c, "", "d", 10*time.Second, 3)
	assert.ErrorIs(t, recv(t, cc), context.DeadlineExceeded)
	assert.ErrorIs(t, recv(t, b), context.DeadlineExceeded)
	assert.NoError(t, recv(t, d), "d is sent after Linger")
	assert.Zero(t, logs.restarts.Load(), "the batcher crashed")
	sent := c.Sent()
	if assert.Len(t, sent, 1) {
		assert.Equal(t, "d", string(sent[0].Body))
	}
}

// On a destination whose requests hold one group (Pub/Sub), a group lane
// [x, y, z] in which y expired while the group had a request in flight:
// the next batch of the group takes x and must pass over the dead y to z.
// Seen in the soak as callers answered twice (y) and never (z), and a
// Stats.Queued that no longer counts z.
func TestOneGroupBatchPassesOverADeadEntry(t *testing.T) {
	inst := startQuiet(t, "onegroup", nil)
	release := make(chan struct{})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20, OneGroupPerRequest: true})
	c.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 1}
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		if string(batch[0].Body) == "w" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return make([]codec.Result, len(batch)), nil
	}
	w := deliverInOrder(t, inst, c, "g", "w", 10*time.Second, 0) // in flight: the group waits
	require.Eventually(t, func() bool { return c.Requests() == 1 }, 5*time.Second, time.Millisecond)
	x := deliverInOrder(t, inst, c, "g", "x", 10*time.Second, 1)
	y := deliverInOrder(t, inst, c, "g", "y", 100*time.Millisecond, 2)
	z := deliverInOrder(t, inst, c, "g", "z", 5*time.Second, 3)
	assert.ErrorIs(t, recv(t, y), context.DeadlineExceeded)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond, "y expired")
	close(release)
	assert.NoError(t, recv(t, w))
	assert.NoError(t, recv(t, x))
	assert.NoError(t, recv(t, z), "z is sent after x")
	var bodies []string
	for _, m := range c.Sent() {
		bodies = append(bodies, string(m.Body))
	}
	assert.Equal(t, []string{"w", "x", "z"}, bodies)
}
