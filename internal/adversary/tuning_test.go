package adversary_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// Durations a user may set to mean "never" (math.MaxInt64): added to the
// batcher's clock, they must saturate rather than overflow into the past
// (overflowing would put every deadline or timer in the past).

// A Config.DefaultTimeout of math.MaxInt64 ("no timeout": Start accepts it)
// is added to the batcher's clock for a *messages.Deliver with no Deadline;
// were the sum to overflow into the past, every such delivery would be
// answered "the deadline passed" without being sent.
func TestDefaultTimeoutForever(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "forever", DefaultTimeout: math.MaxInt64})
	c := fakecodec.New("forever", codec.Limits{MaxEntries: 10, MaxBytes: 100})
	res, err := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("x")}}, answerWithin).Result()
	require.NoError(t, err)
	assert.NoError(t, res.(*messages.Delivered).Err, "a delivery with no deadline under DefaultTimeout math.MaxInt64")
}

// A Tuning.IdleTimeout of math.MaxInt64 ("never stop idle": Tuning.Check
// accepts it) is added to the clock when the new batcher arms its idle
// timer. Were the wake time to overflow into the past, wake-now would
// overflow back to the far future: the timer set for never while the
// batcher notes it as armed before every other time, and never armed
// again, so a lone message would wait for a Linger tick that never comes.
func TestIdleTimeoutForever(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "idleforever"})
	c := fakecodec.New("idleforever", codec.Limits{MaxEntries: 10, MaxBytes: 100})
	c.Tune = codec.Tuning{IdleTimeout: math.MaxInt64}
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	assert.NoError(t, err, "one message, default Linger, IdleTimeout math.MaxInt64")
}

// A Tuning.Linger of math.MaxInt64 ("send full batches only": Tuning.Check
// accepts it) would break the timer the same way once a message is queued:
// the entry's deadline would never wake the batcher, so an actor caller
// would not be answered at its deadline (its future would time out
// instead), and the batcher would never stop idle.
func TestLingerForever(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "lingerforever"})
	c := fakecodec.New("lingerforever", codec.Limits{MaxEntries: 10, MaxBytes: 100})
	c.Tune = codec.Tuning{Linger: math.MaxInt64}
	d := &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("x")}, Deadline: time.Now().Add(100 * time.Millisecond)}
	res, err := system.Root.RequestFuture(inst.PID(), d, answerWithin).Result()
	require.NoError(t, err, "the batcher answers at the entry's deadline, well before the future's timeout")
	assert.ErrorIs(t, res.(*messages.Delivered).Err, context.DeadlineExceeded)
}

// With QueueMaxBytes left zero, a codec whose Limits.MaxBytes is above
// codec.DefaultQueueMaxBytes still queues a message within MaxBytes: the
// default queue bound is never below MaxBytes, so such a message is never
// told to retry forever.
func TestDefaultQueueMaxBytesTakesAMessageWithinMaxBytes(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "bigbytes"})
	c := fakecodec.New("big", codec.Limits{MaxEntries: 10, MaxBytes: 256 << 20})
	c.SizeHook = func(codec.Message) int { return 200 << 20 } // the codec's own count
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
		_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
		cancel()
		var ra *messages.RetryAfterError
		require.Falsef(t, errorsAs(err, &ra), "a message within MaxBytes that no empty queue can take is answered %v: retried forever", err)
	}
}

// A Tuning that Tuning.Check refuses answers every delivery with an error
// that names the field and is permanent, so a caller that follows the error
// catalogue does not retry a delivery that can never succeed.
func TestRefusedTuningIsPermanent(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "badtuning"})
	c := fakecodec.New("bad", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	c.Tune = codec.Tuning{MaxBytes: 1000, QueueMaxBytes: 500}
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	require.ErrorContains(t, err, "Tuning.QueueMaxBytes")
	assert.True(t, codec.IsPermanent(err), "%q is retryable", err)
}
