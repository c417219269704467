package actors_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// The actor form with envelopes: one *messages.Deliver sent to the
// instance's PID several times with a future each (back to back, from
// several goroutines at once, and again after its first answer), and
// copies of it; some name a batcher.Room in a Direct without a Listener,
// which only the first admission may take. Each future gets exactly one
// *messages.Delivered, echoing the Deliver's Ref, with the id of the
// message it carried; every send is sent (none shares another's entry):
// the codec sees the body once per send.
func TestAdv4ActorFormResendsAndCopies(t *testing.T) {
	t.Run("untraced", func(t *testing.T) { adv4ResendsAndCopies(t, nil) })
	t.Run("traced", func(t *testing.T) {
		// The batcher sets each message's trace context: an actor's
		// Deliver, sent twice at once, must be copied, not written.
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		adv4ResendsAndCopies(t, tp)
	})
}

func adv4ResendsAndCopies(t *testing.T, tp trace.TracerProvider) {
	const (
		deliveries = 150
		sends      = 4 // per Deliver: the same pointer twice, a copy, and once more after an answer
		within     = 10 * time.Second
	)
	system, inst := start(t, actors.Config{Name: "adv4room", SinkConcurrency: 2, TracerProvider: tp})
	c := fakecodec.New("adv4room", codec.Limits{MaxEntries: 7, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond}
	c.Latency, c.Jitter = 200*time.Microsecond, 200*time.Microsecond
	c.Hook = echoIDs
	if tp != nil {
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			for _, m := range batch {
				if m.Trace.Parent == "" {
					return nil, fmt.Errorf("%s carries no trace context", m.Body)
				}
			}
			return echoIDs(ctx, batch)
		}
	}

	type sent struct {
		body string
		ref  any
		f    *actor.Future
	}
	var (
		mu  sync.Mutex
		all []sent
		wg  sync.WaitGroup
	)
	send := func(d *messages.Deliver) {
		f := system.Root.RequestFuture(inst.PID(), d, within)
		mu.Lock()
		all = append(all, sent{body: string(d.Message.Body), ref: d.Ref, f: f})
		mu.Unlock()
	}
	for i := range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf("d%d", i)
			d := &messages.Deliver{Codec: c, Message: codec.Message{Tenant: fmt.Sprint("t", i%3), Body: []byte(body)}, Deadline: time.Now().Add(within)}
			switch i % 3 {
			case 0:
				d.Ref = &batcher.Direct{Room: new(batcher.Room)} // no Listener, no Sender: the envelope's sender is answered
			case 1:
				d.Ref = fmt.Sprint("ref-", i)
			}
			var inner sync.WaitGroup
			inner.Add(2)
			go func() { defer inner.Done(); send(d) }()
			go func() { defer inner.Done(); send(d) }()
			cp := *d
			send(&cp)
			inner.Wait()
			// Once more, after the first answers are in.
			mu.Lock()
			var first *actor.Future
			for _, s := range all {
				if s.body == body {
					first = s.f
					break
				}
			}
			mu.Unlock()
			_, _ = first.Result()
			send(d)
		}()
	}
	wg.Wait()

	answered, stored := map[string]int{}, map[string]int{}
	for _, s := range all {
		res, err := s.f.Result()
		if !assert.NoError(t, err, "%s: its future got no answer", s.body) {
			continue
		}
		dl, ok := res.(*messages.Delivered)
		require.True(t, ok, "%s: answered %T", s.body, res)
		if assert.NoError(t, dl.Err, s.body) {
			assert.Equal(t, "id-"+s.body, dl.ID, "%s got another send's answer", s.body)
		}
		if direct, isDirect := s.ref.(*batcher.Direct); isDirect {
			assert.Same(t, direct, dl.Ref, "%s: Delivered.Ref echoes the Deliver's", s.body)
		} else {
			assert.Equal(t, s.ref, dl.Ref, "%s: Delivered.Ref echoes the Deliver's", s.body)
		}
		answered[s.body]++
	}
	require.Len(t, all, deliveries*sends)
	for _, m := range c.Sent() {
		stored[string(m.Body)]++
	}
	require.Len(t, answered, deliveries)
	for b, n := range answered {
		assert.Equal(t, sends, n, "%s: answers", b)
		assert.Equal(t, sends, stored[b], "%s: sends that reached the codec", b)
	}
}
