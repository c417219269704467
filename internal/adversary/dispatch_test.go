package adversary_test

// The batcher's dispatch (one lock launches every batch due, request
// goroutines hand their slot on) under a panic in the middle of a launch.

import (
	"context"
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
// Answer) is asked whether it still waits when its entry is taken; that is
// the caller's code, and dispatch.finish turns its panic on a request
// goroutine into a restart. In the actor, dispatch.step takes every batch
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
	require.ErrorIs(t, res.(*messages.Delivered).Err, messages.ErrBatcherDown, "the batch launched before the panic is answered by the restart")
	require.Positive(t, rp.panics.Load(), "Listening was asked, and panicked")

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
