package actors_test

import (
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

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

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
		panic("advroom: Refused panics")
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
func TestAdvRestartsWhileRoomsAreHeld(t *testing.T) {
	const (
		senders = 8
		each    = 60
	)
	l := &counting{id: "adv-counting", answers: map[uint32][]codec.Result{}}
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
	system, inst := start(t, actors.Config{Name: "advroom", SinkConcurrency: 2, Recorder: rec})
	system.ProcessRegistry.Add(l, l.id)
	t.Cleanup(func() { system.ProcessRegistry.Remove(&actor.PID{Id: l.id}) })

	c := fakecodec.New("advroom", codec.Limits{MaxEntries: 5, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 5 * time.Millisecond, QueueMax: 12}
	c.Latency, c.Jitter = time.Millisecond, time.Millisecond
	c.Hook = echoIDs
	c.SizeHook = func(m codec.Message) int {
		if strings.HasPrefix(string(m.Body), "boom") {
			panic("advroom: Size panics on " + string(m.Body))
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
