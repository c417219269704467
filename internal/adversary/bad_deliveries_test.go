package adversary_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// A nil *messages.Deliver sent to the instance's PID is answered with an
// error; it does not panic on the sender's goroutine, where the PID's process
// runs.
func TestANilDeliverPointerIsAnswered(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "nildeliver"})
	var res any
	var err error
	require.NotPanics(t, func() {
		res, err = system.Root.RequestFuture(inst.PID(), (*messages.Deliver)(nil), answerWithin).Result()
	})
	require.NoError(t, err, "no answer")
	d, ok := res.(*messages.Delivered)
	require.True(t, ok, "%T", res)
	assert.Error(t, d.Err)
}

// A messages.Deliver sent by value (a slip of a missing &) is answered with
// an error, not logged and dropped with its sender left waiting.
func TestDeliverByValueIsAnswered(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{Name: "byvalue"})
	c := fakecodec.New("byvalue", codec.Limits{MaxEntries: 1, MaxBytes: 100})
	res, err := system.Root.RequestFuture(inst.PID(), messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("x")}}, answerWithin).Result()
	require.NoError(t, err, "no answer within %v", answerWithin)
	d, ok := res.(*messages.Delivered)
	require.True(t, ok, "%T", res)
	assert.Error(t, d.Err)
}

// messages.ErrNilCodec answers "a nil interface, or a typed nil pointer":
// a typed nil pointer codec gets it, not the panic of its Name.
func TestATypedNilCodecIsErrNilCodec(t *testing.T) {
	_, inst := testinst.Start(t, actors.Config{Name: "typednil"})
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, err := inst.Deliver(ctx, (*fakecodec.Codec)(nil), codec.Message{Body: []byte("x")})
	assert.ErrorIs(t, err, messages.ErrNilCodec)
}
