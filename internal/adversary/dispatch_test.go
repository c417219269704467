package adversary_test

// The batcher's dispatch (one lock launches every batch due, request
// goroutines hand their slot on) under a panic in the middle of a launch.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// A caller's reply process that is a batcher.Listener (it has Listening and
// Answer) is asked whether it still waits before its entry is sent; that
// is the caller's code, and its panic on a request goroutine becomes a
// restart. In the actor, dispatch.step takes every batch
// due under one lock and counts each one's request goroutine as it takes
// it; the goroutines start only after step returns. When the Listening of
// the second batch's caller panics, the first batch is counted but its
// goroutine never starts: after the restart the count stays one above the
// goroutines there are, so the new incarnation believes a crashed
// incarnation's request still runs (dispatch.inherited) and never sends
// again. Here two groups of a one-group-per-request destination linger
// together; the second's caller panics when asked; a delivery after the
// restart must still be sent.
func TestPanicInSecondLaunchWedgesTheBatcher(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "steppanic"})
	c := fakecodec.New("steppanic", codec.Limits{MaxEntries: 10, MaxBytes: 1000, OneGroupPerRequest: true})
	// Both groups are due at the same Linger tick: a group batch does not
	// restart the linger clock.
	c.Tune = codec.Tuning{Linger: 200 * time.Millisecond, MaxInflight: 2}

	rp := &panickyListener{}
	pid, ok := system.ProcessRegistry.Add(rp, "steppanic-listener")
	require.True(t, ok)
	defer system.ProcessRegistry.Remove(pid)

	deadline := time.Now().Add(answerWithin)
	first := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Group: "a", Body: []byte("a1")}, Deadline: deadline}, answerWithin)
	system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Group: "b", Body: []byte("b1")}, Deadline: deadline}, pid)
	res, err := first.Result()
	require.NoError(t, err)
	// Each request goroutine asks its own batch's callers before it sends:
	// the first batch is sent and answered with its result, unless the
	// restart that the second's panic causes claims it first.
	if err := res.(*messages.Delivered).Err; err != nil {
		require.ErrorIs(t, err, messages.ErrBatcherDown, "the batch launched before the panic is answered once, by its result or by the restart")
	}
	require.Eventually(t, func() bool { return rp.panics.Load() > 0 }, answerWithin, time.Millisecond, "Listening was asked, and panicked")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = inst.Deliver(ctx, c, codec.Message{Group: "c", Body: []byte("c1")})
	assert.NoError(t, err, "a delivery after the restart is sent")
}

// panickyListener is a caller's reply process whose Listening panics.
type panickyListener struct{ panics atomic.Int64 }

func (p *panickyListener) Listening(*actor.PID) bool {
	p.panics.Add(1)
	panic("adversary: Listening panics")
}
func (*panickyListener) Answer(*actor.PID, codec.Result)   {}
func (*panickyListener) SendUserMessage(*actor.PID, any)   {}
func (*panickyListener) SendSystemMessage(*actor.PID, any) {}
func (*panickyListener) Stop(*actor.PID)                   {}

// A sweep (advance's, when a queued deadline passes; admit's, for room)
// removes each entry whose deadline passed into a list it returns, to be
// answered errExpired, and asks alive about the others as it goes. When a
// caller's Listening panics part-way, the entries it already removed are in
// no lane, in no request and in no take (drainAll finds none of them), and
// the restart answers everything but them: their callers are never
// answered. Here A (a future, deadline 100ms) and B (a reply process whose
// Listening panics, deadline an hour) are queued in one tenant's lane, in
// that order, under an hour's Linger; A's deadline passing sweeps the queue.
// With B's sender a process that is no Listener, A is answered
// DeadlineExceeded at 100ms.
func TestPanicInSweepLosesExpiredEntries(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "sweeppanic"})
	c := fakecodec.New("sweeppanic", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	c.Tune = codec.Tuning{Linger: time.Hour}

	rp := &panickyListener{}
	pid, ok := system.ProcessRegistry.Add(rp, "sweeppanic-listener")
	require.True(t, ok)
	defer system.ProcessRegistry.Remove(pid)

	a := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("a")}, Deadline: time.Now().Add(100 * time.Millisecond)}, answerWithin)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, answerWithin, time.Millisecond)
	system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("b")}, Deadline: time.Now().Add(time.Hour)}, pid)
	res, err := a.Result()
	require.NoError(t, err, "A's caller is never answered (Listening panicked %d times)", rp.panics.Load())
	// Answered: by the sweep (expired) or, when the panic came first, by
	// the restart, which finds what the sweep had removed.
	assertExpiredOrDown(t, res.(*messages.Delivered).Err)
}

// assertExpiredOrDown accepts the two answers an entry a crash interrupted
// may get: its deadline's, or the restart's.
func assertExpiredOrDown(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, context.DeadlineExceeded) {
		assert.ErrorIs(t, err, messages.ErrBatcherDown)
	}
}

// A request goroutine that ends its request takes the next batch for its
// slot (dispatch.finish); a caller's Listening that panics in that take
// takes the batcher down from the goroutine. The entries the take had
// already taken out of their lanes are answered by the restart, and the
// goroutine's count is given back, so the next incarnation sends, or, when
// Stop is draining, Stop returns nil once every delivery is answered. Here A
// is in flight (MaxInflight 1) while C and then B (whose Listening panics)
// queue in one lane; A's end takes C, then asks B.
func TestPanicInHandOffTake(t *testing.T) {
	for _, stopping := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopping=%v", stopping), func(t *testing.T) {
			system, inst := testinst.Start(t, actors.Config{Name: "handoffpanic"})
			c := fakecodec.New("handoffpanic", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
			c.Tune = codec.Tuning{MaxInflight: 1}
			release, sending := make(chan struct{}), make(chan struct{}, 1)
			c.Hook = func(_ context.Context, b []codec.Message) ([]codec.Result, error) {
				if string(b[0].Body) == "a" {
					sending <- struct{}{}
					<-release
				}
				return make([]codec.Result, len(b)), nil
			}

			rp := &panickyListener{}
			pid, ok := system.ProcessRegistry.Add(rp, "handoffpanic-listener")
			require.True(t, ok)
			defer system.ProcessRegistry.Remove(pid)

			hour := time.Now().Add(time.Hour)
			deliver := func(body string) *actor.Future {
				return system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte(body)}, Deadline: hour}, answerWithin)
			}
			a := deliver("a")
			<-sending
			cf := deliver("c")
			require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, answerWithin, time.Millisecond)
			system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("b")}, Deadline: hour}, pid)
			require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, answerWithin, time.Millisecond)
			stopped := make(chan error, 1)
			if stopping {
				ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
				defer cancel()
				go func() { stopped <- inst.Stop(ctx) }()
				// The drain has begun when a delivery is refused.
				require.Eventually(t, func() bool {
					// A short wait: a delivery that beats Stop queues
					// behind A, and its caller moves on.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
					defer cancel()
					_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("late")})
					return errors.Is(err, messages.ErrStopped)
				}, answerWithin, time.Millisecond)
			}
			close(release)

			res, err := a.Result()
			require.NoError(t, err)
			if err := res.(*messages.Delivered).Err; err != nil {
				// While Stop drains, the probes' short deadlines bring a
				// sweep that asks B first: the restart comes before A's
				// request ends, and answers A.
				assert.True(t, stopping, "A's request ended before any restart: %v", err)
				assert.ErrorIs(t, err, messages.ErrBatcherDown)
			}
			res, err = cf.Result()
			require.NoError(t, err, "C, taken out of its lane by the take that panicked, is never answered")
			assert.ErrorIs(t, res.(*messages.Delivered).Err, messages.ErrBatcherDown)
			assert.Positive(t, rp.panics.Load(), "Listening was asked, and panicked")

			if stopping {
				assert.NoError(t, <-stopped, "Stop's drain ends once every delivery is answered")
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("d")})
			assert.NoError(t, err, "a delivery after the restart is sent")
		})
	}
}

// dispatch.step takes every batch due in one call; a take answers nothing
// itself, it returns the entries it dropped (deadline passed, caller gone)
// and step collects them for advance to answer. When a later take of the
// same call panics (a caller's Listening), step gives back the goroutine
// count of the batches it took and leaves them in running for the restart,
// but the entries the earlier takes dropped are only in step's own list,
// which the panic discards: in no lane, no request and no take, they are
// never answered. Here a one-group-per-request destination lingers 100ms
// with X0 (deadline 50ms) and X1 in group x and B (whose Listening panics)
// in group b; the batcher is held in Validate until X0's deadline has
// passed, so that no tick sweeps X0 first; then one step takes x (dropping
// X0) and asks B.
func TestPanicInLaterTakeLosesDropped(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "droppanic"})
	c := &gatedGroups{release: make(chan struct{}), validating: make(chan struct{})}

	rp := &panickyListener{}
	pid, ok := system.ProcessRegistry.Add(rp, "droppanic-listener")
	require.True(t, ok)
	defer system.ProcessRegistry.Remove(pid)

	hour := time.Now().Add(time.Hour)
	deliver := func(group, body string, deadline time.Time) *actor.Future {
		return system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Group: group, Body: []byte(body)}, Deadline: deadline}, answerWithin)
	}
	x0Deadline := time.Now().Add(50 * time.Millisecond)
	x0 := deliver("x", "x0", x0Deadline)
	deliver("x", "x1", hour)
	system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Group: "b", Body: []byte("b")}, Deadline: hour}, pid)
	deliver("g", "G", hour) // holds the batcher in Validate
	<-c.validating
	<-time.After(time.Until(x0Deadline.Add(100 * time.Millisecond)))
	close(c.release)

	res, err := x0.Result()
	require.NoError(t, err, "X0's caller is never answered (Listening panicked %d times)", rp.panics.Load())
	assertExpiredOrDown(t, res.(*messages.Delivered).Err)
}

// gatedGroups is a one-group-per-request codec whose Validate of the body
// "G" waits until release is closed, holding the batcher's Receive; it
// lingers 100ms with two requests in flight.
type gatedGroups struct {
	release    chan struct{}
	validating chan struct{}
	once       sync.Once
}

func (c *gatedGroups) Name() string     { return "gatedgroups" }
func (c *gatedGroups) Identity() []byte { return []byte("gatedgroups") }
func (c *gatedGroups) Limits() codec.Limits {
	return codec.Limits{MaxEntries: 10, MaxBytes: 1000, OneGroupPerRequest: true}
}
func (c *gatedGroups) Tuning() codec.Tuning {
	return codec.Tuning{Linger: 100 * time.Millisecond, MaxInflight: 2}
}
func (c *gatedGroups) Size(m codec.Message) int { return len(m.Body) }
func (c *gatedGroups) Validate(m codec.Message) error {
	if string(m.Body) == "G" {
		c.once.Do(func() { close(c.validating) })
		<-c.release
	}
	return nil
}
func (c *gatedGroups) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	return make([]codec.Result, len(b)), nil
}
