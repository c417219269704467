package actors_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// This file measures what sinkbatch keeps in memory: per queued entry, and
// after a crowd of destinations has gone idle. Every figure is a difference
// or a ratio against heap or goroutines measured earlier in the same run, so
// the noise of a shared machine cancels out. Each iteration is a whole
// measurement, so one is enough:
//
//	go test -run '^$' -bench 'Memory|Idle' -benchtime 1x ./actors/

// entryGoal is issue #6's bound on the heap a queued entry costs beyond its
// payload.
const entryGoal = 256

// heapAlloc is the heap in use after a full collection. It collects until two
// readings agree to 0.1%: a finalizer or a sync.Pool's victim cache can free
// more on the second cycle.
func heapAlloc() int64 {
	var ms runtime.MemStats
	prev := int64(-1)
	for range 5 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		cur := int64(ms.HeapAlloc)
		if prev >= 0 && max(cur-prev, prev-cur) <= cur/1000 {
			return cur
		}
		prev = cur
	}
	return prev
}

// sendAll asks a requester to send each delivery with ctx.Request.
type sendAll struct{ msgs []*messages.Deliver }

// requester sends deliveries from inside an actor, as a caller actor does:
// every request carries the same reply PID, and no goroutine, future or reply
// waiter exists per delivery. With Instance.Deliver those would be the
// caller's memory, not the queue's. Answers (at Stop) are dropped.
type requester struct{ to *actor.PID }

func (r *requester) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*sendAll); ok {
		for _, d := range m.msgs {
			ctx.Request(r.to, d)
		}
	}
}

// silent counts the deliveries it receives, keeps none and never answers:
// the bare protoactor path from a requester into a mailbox like a
// batcher's.
type silent struct{ got *atomic.Int64 }

func (s silent) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*messages.Deliver); ok {
		s.got.Add(1)
	}
}

// queueShape is how the queued entries spread over tenants and ordering
// groups: each tenant and each group costs a record of its own.
type queueShape struct {
	name    string
	tenants int
	groups  int // 0: unordered
}

var queueShapes = []queueShape{
	{"tenants=1", 1, 0},
	{"tenants=64", 64, 0},
	{"group-per-entry", 1, -1}, // every entry its own ordering group: the worst case
}

// queueMemory is the heap per entry, in bytes, at each step of
// measureQueueMemory.
type queueMemory struct {
	payload  float64 // the Deliver and Body the caller allocates anyway
	control  float64 // kept after the same sends to a silent actor
	queued   float64 // kept while the entries sit queued in sinkbatch
	overhead float64 // queued - control: the queue's own cost
}

// measureQueueMemory queues n deliveries in one destination whose only
// request is held open, and returns what they cost on the heap.
//
// The payload (each *messages.Deliver with its Tenant, Group and Body, and
// the caller's slice of pointers to them) is allocated before the baseline
// is read, so it is counted in neither delta; its own cost is reported
// beside. The control sends the same deliveries from the same kind of
// requester to a silent actor with the batcher's mailbox type: what it keeps
// (mailbox residue, nothing else) is protoactor's and is subtracted.
func measureQueueMemory(tb testing.TB, n int, shape queueShape) queueMemory {
	system := quietSystem()
	inst, err := actors.Start(system, actors.Config{Name: "memory"})
	require.NoError(tb, err)
	c, v := valved("memory", codec.Limits{MaxEntries: 10, MaxBytes: 256 << 10},
		codec.Tuning{MaxInflight: 1, QueueMax: n, TenantMax: n})
	var got atomic.Int64
	quiet := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return silent{got: &got} },
		actor.WithMailbox(actor.UnboundedPriorityMpsc())))
	toInst := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &requester{to: inst.PID()} }))
	toQuiet := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &requester{to: quiet} }))
	defer func() {
		v.Open()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(tb, inst.Stop(ctx))
		for _, pid := range []*actor.PID{toInst, toQuiet, quiet} {
			_ = system.Root.StopFuture(pid).Wait()
		}
		system.Shutdown()
	}()
	eventually := func(cond func() bool, what string) {
		require.Eventually(tb, cond, 20*time.Second, time.Millisecond, what)
	}

	// The plug: one request held open, so with MaxInflight 1 everything
	// after it stays queued. It also starts the batcher before the baseline.
	plug := &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "plug", Body: []byte("plug")}}
	system.Root.Send(toInst, &sendAll{msgs: []*messages.Deliver{plug}})
	eventually(func() bool { return v.entered.Load() == 1 && inst.Stats().InFlight == 1 }, "the plug is in flight")
	system.Root.Send(toQuiet, &sendAll{msgs: []*messages.Deliver{plug}})
	eventually(func() bool { return got.Load() == 1 }, "the silent actor has the warm-up")

	h0 := heapAlloc()
	msgs := make([]*messages.Deliver, n)
	for i := range msgs {
		m := codec.Message{Tenant: fmt.Sprintf("tenant-%d", i%shape.tenants), Body: make([]byte, 64)}
		if shape.groups < 0 {
			m.Group = fmt.Sprintf("group-%d", i)
		}
		msgs[i] = &messages.Deliver{Codec: c, Message: m}
	}
	h1 := heapAlloc()

	system.Root.Send(toQuiet, &sendAll{msgs: msgs})
	eventually(func() bool { return got.Load() == int64(n)+1 }, "the silent actor has every delivery")
	h2 := heapAlloc()

	system.Root.Send(toInst, &sendAll{msgs: msgs})
	eventually(func() bool { return inst.Stats().Queued == n }, "every delivery is queued")
	h3 := heapAlloc()
	runtime.KeepAlive(msgs)

	per := func(d int64) float64 { return float64(d) / float64(n) }
	return queueMemory{
		payload:  per(h1 - h0),
		control:  per(h2 - h1),
		queued:   per(h3 - h2),
		overhead: per(h3 - h2 - max(h2-h1, 0)),
	}
}

// BenchmarkMemoryPerQueuedEntry reports the heap a queued entry costs beyond
// its payload (goal ≤ 256 B), for 4096 entries queued behind a request held
// open. Payload is the *messages.Deliver the caller allocates, with its
// Tenant, Group and 64-byte Body; see measureQueueMemory.
func BenchmarkMemoryPerQueuedEntry(b *testing.B) {
	const n = 4096
	for _, shape := range queueShapes {
		b.Run(shape.name, func(b *testing.B) {
			var m queueMemory
			for range b.N {
				m = measureQueueMemory(b, n, shape)
			}
			b.ReportMetric(m.overhead, "B/entry-overhead")
			b.ReportMetric(m.payload, "B/entry-payload")
			b.ReportMetric(m.control, "B/entry-control")
			b.ReportMetric(m.overhead/entryGoal, "of-goal")
		})
	}
}

// TestMemoryPerQueuedEntryWithinGoal holds the queue to entryGoal for
// unordered entries. Heap sizes do not depend on timing, and the margin is
// wide (about 75 B an entry with Go 1.26); an entry per ordering group
// costs about 240 B, too close to the goal to hold a test to it, so only
// the benchmark reports it.
func TestMemoryPerQueuedEntryWithinGoal(t *testing.T) {
	for _, shape := range queueShapes[:2] {
		t.Run(shape.name, func(t *testing.T) {
			m := measureQueueMemory(t, 1024, shape)
			assert.LessOrEqual(t, m.overhead, float64(entryGoal), "B per queued entry beyond its payload: %+v", m)
		})
	}
}

// BenchmarkIdleDestinationsReturnToBaseline sends one delivery to each of
// 10 000 destinations (distinct codec values, distinct identities) with an
// IdleTimeout of 200ms, waits until every batcher has stopped idle, and
// compares goroutines and heap with their values before the first delivery
// (goal: ratios ≈ 1, no batcher left). A second wave to the same 10 000
// destinations separates memory that is kept at its high-water mark (Go maps
// do not shrink) from memory that grows per wave: wave2/wave1 ≈ 1 means
// nothing leaks.
func BenchmarkIdleDestinationsReturnToBaseline(b *testing.B) {
	const (
		destinations = 10000
		workers      = 128
		idle         = 200 * time.Millisecond
	)
	for range b.N {
		system := quietSystem()
		inst, err := actors.Start(system, actors.Config{Name: "idle"})
		require.NoError(b, err)
		codecs := make([]*fakecodec.Codec, destinations)
		for i := range codecs {
			c := fakecodec.New(fmt.Sprintf("destination-%05d", i), codec.Limits{MaxEntries: 10, MaxBytes: 256 << 10})
			c.Tune = codec.Tuning{IdleTimeout: idle}
			c.Discard = true
			codecs[i] = c
		}
		msg := codec.Message{Tenant: "t", Body: []byte("x")}

		// settled counts goroutines once the ones that just finished their
		// work have exited (bounded: a leak shows as a ratio above 1).
		settled := func(want int) int {
			g := runtime.NumGoroutine()
			for deadline := time.Now().Add(2 * time.Second); g > want && time.Now().Before(deadline); g = runtime.NumGoroutine() {
				time.Sleep(10 * time.Millisecond)
			}
			return g
		}
		// wave delivers once to every destination and waits for every
		// batcher to stop idle; it returns the most batchers seen at once.
		wave := func() int {
			var peak atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				t := time.NewTicker(time.Millisecond)
				defer t.Stop()
				for {
					peak.Store(max(peak.Load(), int64(inst.Stats().Batchers)))
					select {
					case <-t.C:
					case <-stop:
						return
					}
				}
			}()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1) - 1; i < destinations; i = next.Add(1) - 1 {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						_, err := inst.Deliver(ctx, codecs[i], msg)
						cancel()
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			require.Eventually(b, func() bool { return inst.Stats().Batchers == 0 }, 60*time.Second, 10*time.Millisecond,
				"every batcher stops idle")
			close(stop)
			<-sampled
			return int(peak.Load())
		}

		// The baseline waits for goroutines of an earlier run (-count)
		// to finish exiting.
		g0 := runtime.NumGoroutine()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			g := runtime.NumGoroutine()
			if g == g0 {
				break
			}
			g0 = g
		}
		h0 := heapAlloc()
		peak1 := wave()
		g1, h1 := settled(g0), heapAlloc()
		peak2 := wave()
		g2, h2 := settled(g0), heapAlloc()
		after := inst.Stats()
		runtime.KeepAlive(codecs)

		b.ReportMetric(float64(g1)/float64(g0), "goroutines-after/before")
		b.ReportMetric(float64(h1)/float64(h0), "heap-after/before")
		b.ReportMetric(float64(h1-h0)/destinations, "B/destination-kept")
		b.ReportMetric(float64(g2)/float64(g1), "goroutines-wave2/wave1")
		b.ReportMetric(float64(h2)/float64(h1), "heap-wave2/wave1")
		b.ReportMetric(float64(h2-h1)/destinations, "B/destination-wave2")
		b.ReportMetric(float64(max(peak1, peak2)), "batchers-peak")
		b.ReportMetric(float64(after.Batchers), "batchers-after")

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(b, inst.Stop(ctx))
		cancel()
		system.Shutdown()
	}
}
