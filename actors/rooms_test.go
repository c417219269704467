package actors_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/ankusa/sinkbatch/telemetry"
)

// The actor form with envelopes: one *messages.Deliver sent to the
// instance's PID several times with a future each (back to back, from
// several goroutines at once, and again after its first answer), and
// copies of it; some name a batcher.Room in a Direct without a Listener,
// which only the first admission may take. Each future gets exactly one
// *messages.Delivered, echoing the Deliver's Ref, with the id of the
// message it carried; every send is sent (none shares another's entry):
// the codec sees the body once per send.
func TestActorFormResendsAndCopiesAreEachAnsweredOnce(t *testing.T) {
	t.Run("untraced", func(t *testing.T) { resendsAndCopies(t, nil) })
	t.Run("traced", func(t *testing.T) {
		// The batcher sets each message's trace context: an actor's
		// Deliver, sent twice at once, must be copied, not written.
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		resendsAndCopies(t, tp)
	})
}

func resendsAndCopies(t *testing.T, tp trace.TracerProvider) {
	const (
		deliveries = 150
		sends      = 4 // per Deliver: the same pointer twice, a copy, and once more after an answer
		within     = 10 * time.Second
	)
	system, inst := start(t, actors.Config{Name: "room", SinkConcurrency: 2, TracerProvider: tp})
	c := fakecodec.New("room", codec.Limits{MaxEntries: 7, MaxBytes: 1 << 20})
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

// counting is a reply process that serves many calls as the front door's
// does (a batcher.Listener, registered so that the supervisor's answers
// reach it too), and keeps every answer each call got.
type counting struct {
	id      string
	mu      sync.Mutex
	answers map[uint32][]codec.Result
	total   int
}

func (c *counting) Listening(*actor.PID) bool { return true }

func (c *counting) Answer(pid *actor.PID, r codec.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers[pid.RequestId] = append(c.answers[pid.RequestId], r)
	c.total++
}

func (c *counting) SendUserMessage(pid *actor.PID, message any) {
	if d, ok := actor.UnwrapEnvelopeMessage(message).(*messages.Delivered); ok {
		c.Answer(pid, codec.Result{ID: d.ID, Sequence: d.Sequence, Err: d.Err})
	}
}

func (c *counting) SendSystemMessage(*actor.PID, any) {}
func (c *counting) Stop(*actor.PID)                   {}

// panicky is a Recorder whose Refused panics every third call: it runs in
// the batcher's Receive, so each such panic restarts the batcher.
type panicky struct {
	n atomic.Int64
}

func (p *panicky) Sink(string) telemetry.SinkRecorder { return p }
func (p *panicky) Flushed(telemetry.Flush)            {}
func (p *panicky) Refused(messages.FullReason) {
	if p.n.Add(1)%3 == 0 {
		panic("Refused panics")
	}
}

func (c *counting) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Deliveries that name a Room, sent while the batcher restarts again and
// again (its queue is small and the Recorder panics in every third Refused;
// the codec panics in Size on some bodies too), and sent twice (the same
// Deliver again, and a copy naming the same Room but a sender of its own):
// every send is answered exactly once, with its own message's id or an
// error, never another send's id, and the answers stay at one each after
// Stop.
func TestRestartsWhileRoomsAreHeld(t *testing.T) {
	const (
		senders = 8
		each    = 60
	)
	l := &counting{id: "counting", answers: map[uint32][]codec.Result{}}
	var (
		mu     sync.Mutex
		bodies = map[uint32]string{} // the body each send's answer must name
		sends  int
	)
	// Registered before start: it runs after the instance's Stop.
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		assert.Equal(t, sends, l.total, "answers after Stop")
		for id, rs := range l.answers {
			assert.Len(t, rs, 1, "send %d (%s) answered %d times: %v", id, bodies[id], len(rs), rs)
		}
	})
	rec := &panicky{}
	system, inst := start(t, actors.Config{Name: "room", SinkConcurrency: 2, Recorder: rec})
	system.ProcessRegistry.Add(l, l.id)
	t.Cleanup(func() { system.ProcessRegistry.Remove(&actor.PID{Id: l.id}) })

	c := fakecodec.New("room", codec.Limits{MaxEntries: 5, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 5 * time.Millisecond, QueueMax: 12}
	c.Latency, c.Jitter = time.Millisecond, time.Millisecond
	c.Hook = echoIDs
	c.SizeHook = func(m codec.Message) int {
		if strings.HasPrefix(string(m.Body), "boom") {
			panic("Size panics on " + string(m.Body))
		}
		return len(m.Body)
	}

	var next uint32
	sender := func(body string) *actor.PID {
		mu.Lock()
		defer mu.Unlock()
		next++
		bodies[next] = body
		sends++
		return &actor.PID{Address: system.Address(), Id: l.id, RequestId: next}
	}
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("s%d-%d", g, i)
				if i%7 == 3 {
					body = "boom" + body
				}
				room := new(batcher.Room)
				d := &messages.Deliver{Codec: c, Message: codec.Message{Tenant: fmt.Sprint("t", g%3), Body: []byte(body)}, Deadline: time.Now().Add(10 * time.Second)}
				d.Ref = &batcher.Direct{Listener: l, Sender: sender(body), Room: room}
				system.Root.Send(inst.PID(), d)
				switch i % 5 {
				case 1: // the same Deliver again: same sender, so a send of its own is a copy
					cp := *d
					cp.Ref = &batcher.Direct{Listener: l, Sender: sender(body), Room: room}
					system.Root.Send(inst.PID(), &cp)
				case 2: // a copy made after the first was admitted, or while it is queued
					cp := *d
					cp.Ref = &batcher.Direct{Listener: l, Sender: sender(body), Room: room}
					go system.Root.Send(inst.PID(), &cp)
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	want := sends
	mu.Unlock()
	require.Eventually(t, func() bool { return l.count() >= want }, 10*time.Second, time.Millisecond,
		"every send answered")

	l.mu.Lock()
	defer l.mu.Unlock()
	ok, down, full := 0, 0, 0
	for id, rs := range l.answers {
		body := bodies[id]
		for _, r := range rs {
			switch {
			case r.Err == nil:
				ok++
				assert.Equal(t, "id-"+body, r.ID, "send %d got another send's answer", id)
				assert.False(t, strings.HasPrefix(body, "boom"), "a body whose Size panics was sent")
			case errors.Is(r.Err, messages.ErrBatcherDown):
				down++
			case errors.As(r.Err, new(*messages.RetryAfterError)):
				full++
			case strings.HasPrefix(body, "boom"):
				// Its own Size panic: answered by the restart.
			default:
				assert.Fail(t, "unexpected answer", "send %d (%s): %v", id, body, r.Err)
			}
		}
	}
	assert.Positive(t, ok, "some sends got through")
	assert.Positive(t, rec.n.Load()/3, "the batcher restarted")
	t.Logf("%d sends: %d ok, %d ErrBatcherDown, %d refused, %d restarts", want, ok, down, full, rec.n.Load()/3)
}
