package actors_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// instant answers every message at once and keeps nothing.
type instant struct{ lim codec.Limits }

func (c *instant) Name() string             { return "instant" }
func (c *instant) Identity() []byte         { return nil }
func (c *instant) Limits() codec.Limits     { return c.lim }
func (c *instant) Tuning() codec.Tuning     { return codec.Tuning{} }
func (c *instant) Size(m codec.Message) int { return len(m.Body) }
func (c *instant) SendBatch(_ context.Context, b []codec.Message) ([]codec.Result, error) {
	res := make([]codec.Result, len(b))
	for i := range res {
		res[i].ID = "id"
	}
	return res, nil
}

// echo answers every request at once: the bare protoactor round trip.
type echo struct{}

func (echo) Receive(ctx actor.Context) {
	if d, ok := ctx.Message().(*messages.Deliver); ok {
		ctx.Respond(&messages.Delivered{Ref: d.Ref, ID: "id"})
	}
}

const callers = 1024

// run makes n calls of call from callers goroutines and returns the time
// they took.
func run(n int, call func(ctx context.Context) error) (time.Duration, error) {
	return runFrom(context.Background(), n, call)
}

// runFrom is run with every call's ctx made from base.
func runFrom(base context.Context, n int, call func(ctx context.Context) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				// Each call has its own deadline, as a dispatch attempt does.
				ctx, cancel := context.WithTimeout(base, 30*time.Second)
				err := call(ctx)
				cancel()
				if err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return d, err
	}
	return d, nil
}

type overheadRig struct {
	system *actor.ActorSystem
	inst   *actors.Instance
	echo   *actor.PID
	codec  *instant
	msg    codec.Message
}

func newOverheadRig(b *testing.B) *overheadRig {
	return newOverheadRigWith(b, actors.Config{Name: "bench"})
}

func newOverheadRigWith(b *testing.B, cfg actors.Config) *overheadRig {
	system := quietSystem()
	inst, err := actors.Start(system, cfg)
	if err != nil {
		b.Fatal(err)
	}
	r := &overheadRig{
		system: system, inst: inst,
		echo:  system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return echo{} })),
		codec: &instant{lim: codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}},
		msg:   codec.Message{Tenant: "t", Body: []byte("0123456789abcdef")},
	}
	b.Cleanup(func() {
		_ = system.Root.StopFuture(r.echo).Wait()
		_ = inst.Stop(context.Background())
		system.Shutdown()
	})
	return r
}

// baseline is a protoactor RequestFuture round trip with the same context
// handling as Instance.Deliver: the future's timeout is the ctx deadline.
func (r *overheadRig) baseline(ctx context.Context) error {
	deadline, _ := ctx.Deadline()
	res, err := r.system.Root.RequestFuture(r.echo, &messages.Deliver{Codec: r.codec, Message: r.msg}, time.Until(deadline)).Result()
	if err != nil {
		return err
	}
	return res.(*messages.Delivered).Err
}

func (r *overheadRig) deliver(ctx context.Context) error {
	_, err := r.inst.Deliver(ctx, r.codec, r.msg)
	return err
}

// BenchmarkOverhead compares Instance.Deliver through an instant codec (10
// entries a request) with the bare protoactor round trip, 1024 callers each,
// and reports calls/s, CPU and heap allocations (mallocs/call, unrounded)
// per call.
func BenchmarkOverhead(b *testing.B) {
	for _, mode := range []string{"protoactor", "sinkbatch"} {
		b.Run(mode, func(b *testing.B) {
			r := newOverheadRig(b)
			call := r.baseline
			if mode == "sinkbatch" {
				call = r.deliver
			}
			b.ReportAllocs()
			var ru0 cpuClock
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			ru0.read()
			b.ResetTimer()
			d, err := run(b.N, call)
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/d.Seconds(), "calls/s")
			b.ReportMetric(float64(ru0.since())/float64(b.N), "cpu-ns/call")
			// allocs/op rounded down; this keeps the fraction, the
			// benchmark's own context per call included.
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "mallocs/call")
		})
	}
}

// BenchmarkOverheadRatio measures both in alternating rounds of the same run
// and reports deliveries/s divided by round trips/s (ratio, goal ≥ 1.5) and
// the same for CPU per call (cpu-ratio: round trip's ÷ delivery's). Each
// round starts after a collection (untimed), so that each way pays for the
// garbage it makes rather than for what the other left.
func BenchmarkOverheadRatio(b *testing.B) {
	r := newOverheadRig(b)
	const round = 20000
	var base, ours, baseCPU, oursCPU time.Duration
	for range max(b.N/round, 1) {
		for _, m := range []struct {
			call     func(context.Context) error
			sum, cpu *time.Duration
		}{{r.baseline, &base, &baseCPU}, {r.deliver, &ours, &oursCPU}} {
			runtime.GC()
			var clock cpuClock
			clock.read()
			d, err := run(round, m.call)
			if err != nil {
				b.Fatal(err)
			}
			*m.sum += d
			*m.cpu += clock.since()
		}
	}
	b.ReportMetric(base.Seconds()/ours.Seconds(), "ratio")
	b.ReportMetric(baseCPU.Seconds()/oursCPU.Seconds(), "cpu-ratio")
}

// BenchmarkTracingOverhead measures Instance.Deliver with tracing off and
// with a TracerProvider whose sampler never samples (the spans are started,
// their context carried, nothing recorded), in alternating rounds of the
// same run, beside the bare protoactor round trip. The never-sampled
// deliveries are made twice: from a ctx without a span, and from one whose
// span (a remote parent, not sampled) the create spans are children of, as
// in a traced service. It reports never-sampled deliveries/s divided by
// untraced ones (goal ≥ 0.9), the same for CPU per delivery (untraced ÷
// never-sampled), and each against protoactor. The floor is an untraced
// delivery whose caller also starts and ends one span of the same
// provider, as the SDK's own cost of a dropped span per delivery: no
// tracing that starts a create span per delivery does better than
// floor/off.
func BenchmarkTracingOverhead(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	off := newOverheadRigWith(b, actors.Config{Name: "bench-off"})
	never := newOverheadRigWith(b, actors.Config{Name: "bench-never", TracerProvider: tp})
	parent := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, Remote: true,
	}))
	sdk := tp.Tracer("floor")
	floor := func(ctx context.Context) error {
		_, span := sdk.Start(ctx, "create", trace.WithSpanKind(trace.SpanKindProducer))
		err := off.deliver(ctx)
		span.End()
		return err
	}
	const round = 20000
	var base, offT, neverT, parentT, floorT, offCPU, neverCPU, parentCPU, floorCPU time.Duration
	for range max(b.N/round, 1) {
		for _, m := range []struct {
			from     context.Context
			call     func(context.Context) error
			sum, cpu *time.Duration
		}{
			{context.Background(), off.baseline, &base, nil},
			{context.Background(), off.deliver, &offT, &offCPU},
			{context.Background(), never.deliver, &neverT, &neverCPU},
			{parent, never.deliver, &parentT, &parentCPU},
			{context.Background(), floor, &floorT, &floorCPU},
		} {
			runtime.GC() // each way pays for its own garbage, not the last one's
			var clock cpuClock
			clock.read()
			d, err := runFrom(m.from, round, m.call)
			if err != nil {
				b.Fatal(err)
			}
			*m.sum += d
			if m.cpu != nil {
				*m.cpu += clock.since()
			}
		}
	}
	// Process CPU is steadier than wall time on a shared machine.
	b.ReportMetric(offCPU.Seconds()/neverCPU.Seconds(), "never/off-cpu")
	b.ReportMetric(offCPU.Seconds()/parentCPU.Seconds(), "never-child/off-cpu")
	b.ReportMetric(offCPU.Seconds()/floorCPU.Seconds(), "floor/off-cpu")
	b.ReportMetric(floorCPU.Seconds()/neverCPU.Seconds(), "never/floor-cpu")
	b.ReportMetric(offT.Seconds()/neverT.Seconds(), "never/off")
	b.ReportMetric(offT.Seconds()/floorT.Seconds(), "floor/off")
	b.ReportMetric(offT.Seconds()/parentT.Seconds(), "never-child/off")
	b.ReportMetric(base.Seconds()/offT.Seconds(), "off/protoactor")
	b.ReportMetric(base.Seconds()/neverT.Seconds(), "never/protoactor")
}

// boundRig starts an instance and a codec whose requests take latency.
func boundRig(b *testing.B, latency time.Duration, inflight int) (*actors.Instance, *fakecodec.Codec) {
	system := quietSystem()
	inst, err := actors.Start(system, actors.Config{Name: "bound"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = inst.Stop(context.Background())
		system.Shutdown()
	})
	c := fakecodec.New("bound", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{MaxInflight: inflight}
	c.Latency = latency
	c.Discard = true
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		return make([]codec.Result, len(batch)), nil
	}
	return inst, c
}

// BenchmarkBound saturates a destination whose requests take L with N in
// flight, and reports deliveries/s divided by N × 10 / (mean request time
// measured inside the codec): 1.0 is the destination's own limit.
func BenchmarkBound(b *testing.B) {
	for _, tc := range []struct {
		latency  time.Duration
		inflight int
	}{{20 * time.Millisecond, 8}, {2 * time.Millisecond, 32}} {
		b.Run(fmt.Sprintf("L=%v/N=%d", tc.latency, tc.inflight), func(b *testing.B) {
			inst, c := boundRig(b, tc.latency, tc.inflight)
			msg := codec.Message{Tenant: "t", Body: []byte("x")}
			n := max(b.N, 20*tc.inflight*10)
			// Warm up: start the batcher.
			if _, err := inst.Deliver(context.Background(), c, msg); err != nil {
				b.Fatal(err)
			}
			req0, busy0 := c.Requests(), c.Busy()
			b.ResetTimer()
			d, err := run(n, func(ctx context.Context) error {
				_, err := inst.Deliver(ctx, c, msg)
				return err
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			reqs := c.Requests() - req0
			mean := (c.Busy() - busy0) / time.Duration(reqs)
			bound := float64(tc.inflight*10) / mean.Seconds()
			got := float64(n) / d.Seconds()
			b.ReportMetric(got, "deliveries/s")
			b.ReportMetric(got/bound, "of-bound")
			b.ReportMetric(float64(n)/float64(reqs), "entries/request")
		})
	}
}

// smallTenant sends 20 rounds of the small tenant's 10 concurrent
// messages to c and returns their latencies.
func smallTenant(b *testing.B, inst *actors.Instance, c codec.Codec) []time.Duration {
	var out []time.Duration
	for range 20 {
		lat := make([]time.Duration, 10)
		var wg sync.WaitGroup
		for i := range lat {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				if _, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "small", Body: []byte("s")}); err != nil {
					b.Error(err)
				}
				lat[i] = time.Since(start)
			}()
		}
		wg.Wait()
		out = append(out, lat...)
	}
	return out
}

// p99 is the 99th percentile of d, which it sorts.
func p99(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)*99/100]
}

// BenchmarkFairness measures a small tenant's p99 latency beside a tenant
// flooding 10 000 deliveries, divided by its p99 alone (goal ≤ 2), with the
// default tuning (8 requests in flight, 10 entries each) and requests that
// take L, or L ± J when the destination's round trips vary. The p99s are
// over every iteration's samples (200 each).
//
// Round-robin splits the small tenant's 10 entries over two batches beside
// the flood. When the 8 slots' requests end at evenly spread times, those go
// out within about 2/8 L, so the ratio is about 1.25 plus the flood's share
// of the machine. With a fixed L the slots stay in step: requests launched
// together end together, a new tenant waits for the next round of ends, up to
// L, and the ratio is up to 2 plus that share.
func BenchmarkFairness(b *testing.B) {
	for _, tc := range []struct{ latency, jitter time.Duration }{
		{time.Millisecond, 0}, {5 * time.Millisecond, 0}, {5 * time.Millisecond, 2500 * time.Microsecond},
	} {
		name := fmt.Sprintf("L=%v", tc.latency)
		if tc.jitter > 0 {
			name += fmt.Sprintf("±%v", tc.jitter)
		}
		b.Run(name, func(b *testing.B) { benchFairness(b, tc.latency, tc.jitter) })
	}
}

func benchFairness(b *testing.B, latency, jitter time.Duration) {
	system := quietSystem()
	inst, err := actors.Start(system, actors.Config{Name: "fair"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = inst.Stop(context.Background())
		system.Shutdown()
	}()
	c := fakecodec.New("fair", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Latency = latency
	c.Jitter = jitter
	c.Discard = true
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		return make([]codec.Result, len(batch)), nil
	}
	small := func() []time.Duration { return smallTenant(b, inst, c) }
	var alone, beside []time.Duration
	var aloneReq, besideReq requestTime
	for range b.N {
		aloneReq.around(c, func() { alone = append(alone, small()...) })
		var left atomic.Int64
		left.Store(10000)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					for {
						_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "flood", Body: []byte("f")})
						var ra *messages.RetryAfterError
						if !errors.As(err, &ra) {
							break
						}
						select {
						case <-time.After(ra.After):
						case <-stop:
							return
						}
					}
				}
			}()
		}
		for inst.Stats().Queued < 500 {
			runtime.Gosched()
		}
		besideReq.around(c, func() { beside = append(beside, small()...) })
		if left.Load() <= 0 {
			b.Error("the flood ended before the small tenant's rounds did: raise the flood")
		}
		close(stop)
		wg.Wait()
	}
	a, s := p99(alone), p99(beside)
	b.ReportMetric(float64(a.Microseconds()), "alone-p99-µs")
	b.ReportMetric(float64(s.Microseconds()), "beside-p99-µs")
	b.ReportMetric(float64(s)/float64(a), "ratio")
	// How long a request took inside the codec, alone and beside the flood:
	// on a loaded machine a timer wakes late, so L itself grows.
	b.ReportMetric(float64(aloneReq.mean().Microseconds()), "alone-request-µs")
	b.ReportMetric(float64(besideReq.mean().Microseconds()), "beside-request-µs")
}

// requestTime sums the time requests took inside a fake codec.
type requestTime struct {
	busy     time.Duration
	requests int64
}

// around adds the requests made while f runs.
func (r *requestTime) around(c *fakecodec.Codec, f func()) {
	busy, reqs := c.Busy(), c.Requests()
	f()
	r.busy += c.Busy() - busy
	r.requests += c.Requests() - reqs
}

func (r *requestTime) mean() time.Duration {
	if r.requests == 0 {
		return 0
	}
	return r.busy / time.Duration(r.requests)
}
