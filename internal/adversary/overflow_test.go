package adversary_test

// Durations a user may set to mean "never" (math.MaxInt64): added to the
// batcher's clock, they must saturate rather than overflow into the past
// (found by this package; fixed in d486a59).

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
