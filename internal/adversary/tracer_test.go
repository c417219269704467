package adversary_test

// Focused tests of a TracerProvider that panics: user code, as a Recorder
// is, which the batcher calls from its Receive and from its request
// goroutines.

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// panickySampler samples every span, and panics for spans whose name starts
// with prefix once armed.
type panickySampler struct {
	prefix string
	armed  atomic.Bool
}

func (s *panickySampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if s.armed.Load() && strings.HasPrefix(p.Name, s.prefix) {
		panic("adversary: the sampler panics on " + p.Name)
	}
	return sdktrace.AlwaysSample().ShouldSample(p)
}

func (s *panickySampler) Description() string { return "panicky" }

// A panic in the TracerProvider while a delivery's create span starts (in
// the batcher's Receive) once restarted the batcher before the delivery was
// its current one, so nobody answered it. Now the panic costs the span: the
// delivery is sent without one and answered.
func TestTracerPanicInCreateLosesTheDelivery(t *testing.T) {
	s := &panickySampler{prefix: "create"}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	system, inst := testinst.Start(t, actors.Config{Name: "tracepanic", TracerProvider: tp})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	// The batcher runs before the panic is armed: what follows is a
	// delivery to a running batcher.
	_, err := inst.Deliver(context.Background(), c, codec.Message{Body: []byte("warm")})
	require.NoError(t, err)
	s.armed.Store(true)

	f := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte("a")}, Ref: 1}, answerWithin)
	res, err := f.Result()
	require.NoError(t, err, "an actor's delivery is not answered within %v after a panic in the TracerProvider", answerWithin)
	require.IsType(t, &messages.Delivered{}, res)

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("b")})
		answered <- err
	}()
	select {
	case err := <-answered:
		// Answered, which is the point: the span is lost, not the
		// delivery, so it is sent without one.
		assert.NoError(t, err)
	case <-time.After(answerWithin):
		t.Fatalf("a Deliver with an hour's deadline is not answered within %v after a panic in the TracerProvider", answerWithin)
	}
	s.armed.Store(false)
}

// childEnv names, in a child test process, the case it runs.
const childEnv = "ADVERSARY_TRACER_CHILD"

// A panic in the TracerProvider on a request goroutine (the send span's
// Start, or a create span's End as its caller is answered) is not
// recovered: the process ends. The test runs the case in a child process
// and requires that it exits cleanly.
func TestTracerPanicOnRequestGoroutineEndsTheProcess(t *testing.T) {
	for _, tc := range []string{"send-start", "create-end"} {
		t.Run(tc, func(t *testing.T) {
			if os.Getenv(childEnv) == tc {
				tracerPanicChild(t, tc)
				return
			}
			if os.Getenv(childEnv) != "" {
				t.Skip("another child's case")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestTracerPanicOnRequestGoroutineEndsTheProcess$/^"+tc+"$", "-adversary.unfixed", "-test.v")
			cmd.Env = append(os.Environ(), childEnv+"="+tc)
			out, err := cmd.CombinedOutput()
			text := string(out)
			if i := strings.Index(text, "panic:"); i >= 0 {
				text = text[i:]
			}
			lines := strings.Split(text, "\n")
			require.NoError(t, err, "the process ended: %s", strings.Join(lines[:min(len(lines), 8)], "\n"))
		})
	}
}

// tracerPanicChild delivers one message through a TracerProvider that
// panics on the request goroutine, as tc says.
func tracerPanicChild(t *testing.T, tc string) {
	opts := []sdktrace.TracerProviderOption{}
	switch tc {
	case "send-start":
		s := &panickySampler{prefix: "send "}
		s.armed.Store(true)
		opts = append(opts, sdktrace.WithSampler(s))
	case "create-end":
		opts = append(opts, sdktrace.WithSpanProcessor(&panicOnEnd{prefix: "create "}))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, inst := testinst.Start(t, actors.Config{Name: "tracepanic", TracerProvider: tp})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
	defer cancel()
	_, _ = inst.Deliver(ctx, c, codec.Message{Body: []byte("a")})
}

// panicOnEnd is a SpanProcessor that panics when a span whose name starts
// with prefix ends.
type panicOnEnd struct{ prefix string }

func (p *panicOnEnd) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (p *panicOnEnd) OnEnd(s sdktrace.ReadOnlySpan) {
	if strings.HasPrefix(s.Name(), p.prefix) {
		panic("adversary: the span processor panics on " + s.Name())
	}
}
func (p *panicOnEnd) Shutdown(context.Context) error   { return nil }
func (p *panicOnEnd) ForceFlush(context.Context) error { return nil }
