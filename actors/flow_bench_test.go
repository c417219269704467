package actors_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

var (
	flowDur    = flag.Duration("flow.dur", 2*time.Second, "BenchmarkAdaptive: measured time per configuration")
	strictMsgs = flag.Int("flow.strict", 20000, "BenchmarkStrictGroups: messages per run (the issue's figure is 100000)")
)

// simDest is a simulated destination whose request time is
// base × max(1, inflight/K)², and which answers throttled (after one base
// round trip) above 2K requests in flight. K can change while it runs.
type simDest struct {
	id       string
	tune     codec.Tuning
	base     time.Duration
	k        atomic.Int64
	inflight atomic.Int64
}

func (s *simDest) Name() string             { return "sim" }
func (s *simDest) Identity() []byte         { return []byte(s.id) }
func (s *simDest) Limits() codec.Limits     { return codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20} }
func (s *simDest) Tuning() codec.Tuning     { return s.tune }
func (s *simDest) Size(m codec.Message) int { return len(m.Body) }

func (s *simDest) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	k := s.k.Load()
	d := s.base
	throttled := n > 2*k
	if !throttled {
		f := max(1, float64(n)/float64(k))
		d = time.Duration(float64(s.base) * f * f)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if throttled {
		return nil, &codec.EntryError{Code: "ThrottlingException", Throttled: true}
	}
	return make([]codec.Result, len(batch)), nil
}

// loadResult is what a closed-loop load measured.
type loadResult struct {
	perSec float64
	p99    time.Duration
	limits string // the adaptive limit's trace
}

// closedLoop runs callers that each deliver one message after another to
// c for warm+dur, retrying a message until it is accepted (after
// RetryAfter when refused for fullness, at once otherwise), and measures
// the messages accepted during dur, and the latency from first attempt to
// acceptance of those first sent during dur.
// change, if set, runs at warm+dur/2.
func closedLoop(tb testing.TB, c codec.Codec, callers int, warm, dur time.Duration, change func()) loadResult {
	system := quietSystem()
	lims := &limitTrace{}
	inst, err := actors.Start(system, actors.Config{Name: "flowbench", Recorder: lims})
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		_ = inst.Stop(context.Background())
		system.Shutdown()
	}()
	start := time.Now()
	from, to := start.Add(warm), start.Add(warm+dur)
	var mu sync.Mutex
	var lat []time.Duration
	var done atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(to) {
				t0 := time.Now()
				ok := false
				for !ok && time.Now().Before(to.Add(5*time.Second)) {
					ctx, cancel := context.WithDeadline(context.Background(), to.Add(5*time.Second))
					_, err := inst.Deliver(ctx, c, codec.Message{Body: []byte("m")})
					cancel()
					ok = err == nil
					var ra *messages.RetryAfterError
					if errors.As(err, &ra) {
						time.Sleep(ra.After)
					}
				}
				now := time.Now()
				if ok && now.After(from) && now.Before(to) {
					done.Add(1)
				}
				if t0.After(from) {
					if !ok {
						now = now.Add(time.Hour) // never answered: worse than any
					}
					mine = append(mine, now.Sub(t0))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	if change != nil {
		time.Sleep(time.Until(from.Add(dur / 2)))
		change()
	}
	wg.Wait()
	if len(lat) == 0 {
		return loadResult{}
	}
	slices.Sort(lat)
	return loadResult{perSec: float64(done.Load()) / dur.Seconds(), p99: lat[len(lat)*99/100], limits: lims.summary()}
}

// limitTrace is a Recorder that keeps the adaptive limits it is told.
type limitTrace struct {
	mu     sync.Mutex
	limits []int
}

func (r *limitTrace) Sink(string) telemetry.SinkRecorder { return r }
func (r *limitTrace) Flushed(telemetry.Flush)            {}
func (r *limitTrace) Refused(messages.FullReason)        {}
func (r *limitTrace) InflightLimit(_ string, limit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if limit > 0 {
		r.limits = append(r.limits, limit)
	}
}

// summary is the limits' changes, their mean and range.
func (r *limitTrace) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.limits) == 0 {
		return ""
	}
	sum, lo, hi := 0, r.limits[0], r.limits[0]
	for _, l := range r.limits {
		sum += l
		lo, hi = min(lo, l), max(hi, l)
	}
	return fmt.Sprintf("%d changes, mean %.1f, range %d..%d, last %d", len(r.limits), float64(sum)/float64(len(r.limits)), lo, hi, r.limits[len(r.limits)-1])
}

// BenchmarkAdaptive compares Adaptive (MaxInflight 64) with every fixed
// MaxInflight from 1 to 64 on a simulated destination (K = 6, base 5 ms,
// 2 048 callers), and on one whose K drops from 6 to 3 halfway. It reports
// the adaptive run's throughput and p99 as ratios of the best fixed
// limit's, and fixed 64's throughput as a ratio of the best. Run it with
// -benchtime=1x; -flow.dur sets each configuration's measured time.
func BenchmarkAdaptive(b *testing.B) {
	for _, tc := range []struct {
		name   string
		k, end int64
	}{{"K=6", 6, 6}, {"K=6to3", 6, 3}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				run := func(tune codec.Tuning) loadResult {
					tune.TenantMax = 4096 // every caller is tenant "": none is refused
					d := &simDest{id: fmt.Sprintf("%s-%+v", tc.name, tune), tune: tune, base: 5 * time.Millisecond}
					d.k.Store(tc.k)
					change := func() { d.k.Store(tc.end) }
					return closedLoop(b, d, 2048, 500*time.Millisecond, *flowDur, change)
				}
				var best loadResult
				bestN := 0
				var fixed64 loadResult
				for _, n := range []int{1, 2, 3, 4, 6, 8, 12, 16, 32, 64} {
					r := run(codec.Tuning{MaxInflight: n})
					b.Logf("%s fixed %2d: %8.0f msgs/s p99 %v", tc.name, n, r.perSec, r.p99)
					if r.perSec > best.perSec {
						best, bestN = r, n
					}
					if n == 64 {
						fixed64 = r
					}
				}
				a := run(codec.Tuning{MaxInflight: 64, Adaptive: true})
				b.Logf("%s adaptive: %8.0f msgs/s p99 %v (best fixed %d); limit: %s", tc.name, a.perSec, a.p99, bestN, a.limits)
				b.ReportMetric(a.perSec/best.perSec, "adaptive/best-throughput")
				b.ReportMetric(float64(a.p99)/float64(best.p99), "adaptive/best-p99")
				b.ReportMetric(fixed64.perSec/best.perSec, "fixed64/best-throughput")
				b.ReportMetric(float64(bestN), "best-fixed")
			}
		})
	}
}

// BenchmarkBlock floods a destination with WhenFull Block and QueueMax 256
// (8 requests of 10 entries in flight, 2 ms each) from `callers`
// goroutines, 10 000 deliveries each round, and measures refusals, callers
// answered after their deadline, and a small tenant's p99 beside the flood
// divided by its p99 alone. At most in-flight entries + 2 × QueueMax
// callers (80 + 512) can be held without a refusal: 512 callers fit, 1 024
// do not, and the refusals show the bound holding.
func BenchmarkBlock(b *testing.B) {
	for _, n := range []int{512, 1024} {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) { benchBlock(b, n) })
	}
}

func benchBlock(b *testing.B, floodCallers int) {
	system := quietSystem()
	inst, err := actors.Start(system, actors.Config{Name: "block"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = inst.Stop(context.Background())
		system.Shutdown()
	}()
	c := fakecodec.New("block", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{WhenFull: codec.Block, QueueMax: 256}
	c.Latency = 2 * time.Millisecond
	c.Discard = true
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		return make([]codec.Result, len(batch)), nil
	}
	small := func() []time.Duration { return smallTenant(b, inst, c) }
	var alone, beside []time.Duration
	var refused, late, delivered atomic.Int64
	for range b.N {
		alone = append(alone, small()...)
		var left atomic.Int64
		left.Store(10000)
		var wg sync.WaitGroup
		for range floodCallers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					deadline := time.Now().Add(10 * time.Second)
					ctx, cancel := context.WithDeadline(context.Background(), deadline)
					_, err := inst.Deliver(ctx, c, codec.Message{Tenant: "flood", Body: []byte("f")})
					cancel()
					var ra *messages.RetryAfterError
					switch {
					case errors.As(err, &ra):
						refused.Add(1)
					case err != nil || time.Now().After(deadline):
						late.Add(1)
					default:
						delivered.Add(1)
					}
				}
			}()
		}
		for inst.Stats().Waiting == 0 && left.Load() > 0 {
			time.Sleep(100 * time.Microsecond)
		}
		beside = append(beside, small()...)
		if left.Load() <= 0 {
			b.Log("the flood ended before the small tenant's rounds did")
		}
		wg.Wait()
	}
	a, s := p99(alone), p99(beside)
	b.ReportMetric(float64(refused.Load()), "refused")
	b.ReportMetric(float64(late.Load()), "late")
	b.ReportMetric(float64(delivered.Load())/float64(b.N), "delivered/round")
	b.ReportMetric(float64(a.Microseconds()), "alone-p99-µs")
	b.ReportMetric(float64(s.Microseconds()), "beside-p99-µs")
	b.ReportMetric(float64(s)/float64(a), "ratio")
}

// BenchmarkStrictGroups sends -flow.strict messages over 64 groups to a
// FIFO queue on fauxqs (5 % of entries fail, and with them their group's
// later entries in the request) and to pstest ordering keys (5 % of
// requests fail), with the retrying callers, and reports the messages the
// server stored out of first-delivery order with StrictGroups and without.
func BenchmarkStrictGroups(b *testing.B) {
	groups := groupNames(64)
	per := max(*strictMsgs/len(groups), 1)
	for _, server := range []string{"fauxqs", "pstest"} {
		b.Run(server, func(b *testing.B) {
			for range b.N {
				for _, strict := range []bool{true, false} {
					var c codec.Codec
					var stored func() map[string][]string
					switch server {
					case "fauxqs":
						q := NewSQS(b, NewFaults(0, 0.05, 3))
						c, stored = q.Codec(b, codec.Tuning{StrictGroups: strict}), func() map[string][]string { return q.Stored(b) }
					default:
						p := NewPubSub(b, NewFaults(0.05, 0, 4))
						c, stored = p.Codec(b, codec.Tuning{StrictGroups: strict, MaxEntries: 10}), p.Stored
					}
					system := quietSystem()
					inst, err := actors.Start(system, actors.Config{Name: "strictbench"})
					if err != nil {
						b.Fatal(err)
					}
					t0 := time.Now()
					retries := Callers(b, system, inst.PID(), c, groups, per)
					took := time.Since(t0)
					_ = inst.Stop(context.Background())
					system.Shutdown()
					bad, missing := Violations(stored(), groups, per)
					if missing != 0 {
						b.Errorf("%d messages missing", missing)
					}
					name := "off"
					if strict {
						name = "strict"
					}
					b.ReportMetric(float64(bad), name+"-out-of-order")
					b.ReportMetric(float64(retries), name+"-retries")
					b.ReportMetric(float64(per*len(groups))/took.Seconds(), name+"-msgs/s")
				}
			}
		})
	}
}
