package actors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// With tracing on, create spans the callers start and end on their own
// goroutines meet every way a call ends at once: DefaultTimeout's answer
// (errNoAnswer) for no-deadline calls to a destination that never answers,
// a ctx deadline, a cancel, an answer, a refusal for fullness, and a
// batcher restarting under queued entries (a Recorder that panics in
// Refused). Every span, create or send, is ended exactly once, and each
// call started one create span.
func TestAdvEveryTracedSpanEndsOnceUnderTimeoutsAndRestarts(t *testing.T) {
	const (
		timeout = 40 * time.Millisecond
		callers = 16
		each    = 12
	)
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tp := &countingProvider{TracerProvider: sdk}
	var calls atomic.Int64
	// Registered before start: it runs after the instance's Stop.
	t.Cleanup(func() {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		creates := 0
		for _, s := range tp.spans {
			assert.EqualValues(t, 1, s.ends.Load(), "a span was ended %d times", s.ends.Load())
			if s.ends.Load() == 1 && len(spanName(rec, s)) >= 6 && spanName(rec, s)[:6] == "create" {
				creates++
			}
		}
		assert.EqualValues(t, calls.Load(), creates, "one create span per call")
	})
	restarts := &panicky{}
	_, inst := start(t, actors.Config{Name: "advtrace", DefaultTimeout: timeout, TracerProvider: tp, Recorder: restarts})

	lim := codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20}
	silent, _ := silentCodec(t, lim)
	// busy has a small queue, so that deliveries are refused and the
	// Recorder's panics restart its batcher under queued entries.
	busy := fakecodec.New("busy", codec.Limits{MaxEntries: 2, MaxBytes: 1 << 20})
	busy.Tune = codec.Tuning{Linger: time.Millisecond, QueueMax: 2, MaxInflight: 1}
	busy.Latency = 3 * time.Millisecond
	busy.Hook = echoIDs

	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := codec.Message{Tenant: "t", Body: []byte(fmt.Sprintf("g%d-%d", g, i))}
				// Half the calls are children of a caller's span.
				ctx, parent := context.Background(), trace.Span(nil)
				if i%2 == 0 {
					ctx, parent = sdk.Tracer("caller").Start(ctx, "caller")
				}
				began := time.Now()
				calls.Add(1)
				switch rand.IntN(4) {
				case 0: // no deadline: DefaultTimeout ends it
					_, err := inst.Deliver(ctx, silent, msg)
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.GreaterOrEqual(t, time.Since(began), timeout)
				case 1: // a cancel before DefaultTimeout
					cctx, cancel := context.WithCancel(ctx)
					timer := time.AfterFunc(time.Duration(rand.IntN(int(timeout))), cancel)
					_, err := inst.Deliver(cctx, silent, msg)
					timer.Stop()
					cancel()
					assert.Error(t, err)
				case 2: // a deadline
					dctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(int(timeout))))
					_, err := inst.Deliver(dctx, silent, msg)
					cancel()
					assert.Error(t, err)
				default: // a burst: answered, refused or ErrBatcherDown
					var burst sync.WaitGroup
					calls.Add(5)
					for range 6 {
						burst.Add(1)
						go func() {
							defer burst.Done()
							_, _ = inst.Deliver(ctx, busy, msg)
						}()
					}
					burst.Wait()
				}
				if parent != nil {
					parent.End()
				}
			}
		}()
	}
	wg.Wait()
	assert.Positive(t, restarts.n.Load()/3, "busy's batcher restarted")
}
