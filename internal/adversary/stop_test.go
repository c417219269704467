package adversary_test

// Stop's promises under a backlog.

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
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// Stop's doc: if its ctx ends first, "whatever is still queued or in flight
// is answered with ErrStopped". The supervisor sends Abort to each draining
// batcher, which then answers every delivery still on its way at once; but
// Abort has the mailbox's default priority, so it waits behind every
// delivery already in the mailbox, each admitted in full (Validate, Size,
// the queue). With a backlog that takes longer than abortGrace (5 s) to
// admit, Stop gives up waiting and stops the batcher, and protoactor drops
// what is still in its mailbox: those callers are never answered. Here a
// codec whose Size costs a millisecond (it encodes to count) and an actor
// that sent 8000 deliveries before Stop.
func TestStopAbortWaitsBehindBacklog(t *testing.T) {
	system := testinst.System()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "backlog"})
	require.NoError(t, err)
	c := &slowSizer{}
	// The batcher is running before the backlog is sent.
	res, err := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("first")}}, answerWithin).Result()
	require.NoError(t, err)
	require.NoError(t, res.(*messages.Delivered).Err)

	const n = 8000
	answers := &answerCounter{}
	pid, ok := system.ProcessRegistry.Add(answers, "backlog-answers")
	require.True(t, ok)
	defer system.ProcessRegistry.Remove(pid)
	hour := time.Now().Add(time.Hour)
	for i := range n {
		system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Tenant: string(rune('a' + i%20)), Body: []byte("x")}, Deadline: hour}, pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	stopped := inst.Stop(ctx)
	require.ErrorIs(t, stopped, context.DeadlineExceeded)
	assert.EqualValues(t, n, answers.n.Load(), "deliveries answered by the time Stop returned")
	assert.Zero(t, answers.other.Load(), "answers that are not ErrStopped, RetryAfterError or success")
}

// slowSizer is a codec whose Size takes a millisecond.
type slowSizer struct{}

func (*slowSizer) Name() string         { return "slowsize" }
func (*slowSizer) Identity() []byte     { return []byte("slowsize") }
func (*slowSizer) Limits() codec.Limits { return codec.Limits{MaxEntries: 10, MaxBytes: 1000} }
func (*slowSizer) Tuning() codec.Tuning { return codec.Tuning{} }
func (*slowSizer) Size(m codec.Message) int {
	time.Sleep(time.Millisecond)
	return len(m.Body)
}
func (*slowSizer) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	return make([]codec.Result, len(b)), nil
}

// answerCounter is a reply process that counts the *messages.Delivered it
// is sent.
type answerCounter struct{ n, other atomic.Int64 }

func (a *answerCounter) SendUserMessage(_ *actor.PID, message any) {
	d, ok := actor.UnwrapEnvelopeMessage(message).(*messages.Delivered)
	if !ok {
		return
	}
	a.n.Add(1)
	var ra *messages.RetryAfterError
	if d.Err != nil && !errorsAs(d.Err, &ra) && d.Err != messages.ErrStopped {
		a.other.Add(1)
	}
}
func (*answerCounter) SendSystemMessage(*actor.PID, any) {}
func (*answerCounter) Stop(*actor.PID)                   {}
