package adversary_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// describePanicker is a fake codec whose Describe (codec.Describer, read
// when a traced destination's batcher starts) panics.
type describePanicker struct{ *fakecodec.Codec }

func (describePanicker) Describe() (string, string) { panic("adversary: Describe panics") }

// With tracing on, a codec whose Describe panics made its batcher panic in
// Started, every time it started: protoactor restarted it, it panicked
// again, about 180 000 times in 7 s, for as long as the instance lived. No
// delivery to that destination was ever taken from the mailbox, and Stop,
// whose ctx then ended, could not answer them either: the caller got only
// its own deadline.
//
// Promises broken (actors/actors.go, Instance.Stop): "If ctx ends first,
// whatever is still queued or in flight, and every delivery still on its
// way to a batcher's mailbox, is answered with ErrStopped before Stop
// returns ... Only a codec stuck in Size or Validate can hold it up"; and
// the package doc's Failure section, which contains codec panics to the
// message or the batch, not the destination for good. Now the panic is
// logged, the spans are named by the codec's Name, and the destination
// works.
func TestAdv16DescribePanicIsContained(t *testing.T) {
	logs := &testinst.Buffer{}
	system := testinst.System()
	inst, err := actors.Start(system, actors.Config{
		Name:           "describe",
		TracerProvider: noop.NewTracerProvider(),
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer system.Shutdown()
	c := describePanicker{fakecodec.New("describe", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("x")})
	assert.NoError(t, err)
	assert.Len(t, c.Sent(), 1)
	assert.Zero(t, logs.Count("batcher crashed; restarting it"), "the batcher crashed")
	assert.Equal(t, 1, logs.Count("codec panicked in Describe"), "the panic was not logged once")

	stopCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	assert.NoError(t, inst.Stop(stopCtx))
	_, err = inst.Deliver(ctx, c, codec.Message{Body: []byte("y")})
	assert.ErrorIs(t, err, messages.ErrStopped)
}
