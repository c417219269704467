// Command lingerplot draws what Tuning.Linger trades, measured on this
// machine against one in-process destination whose requests take a fixed
// 2ms (an SQS-shaped fake codec: 10 entries a request, 8 requests in flight).
//
//	go run ./cmd/lingerplot -out docs/linger.png
//
// Left panel: deliveries/s against Linger at two fixed loads of closed-loop
// callers (each sends its next delivery when the last is answered): 8, fewer
// than a request holds, and 64, more. Right panel: p50 (solid) and p99
// (dashed) latency of one delivery against the number of callers, for three
// Lingers. Each figure is the median of -rounds rounds of -window each, on a
// fresh instance after a warm-up; the run takes about 40s and also prints
// the table it plots, with entries per request.
//
// How to read it: Linger is paid only by a lightly loaded destination.
// With fewer callers than a request holds, every batch waits out the whole
// Linger, so a delivery takes Linger + the request time and throughput
// follows callers / (Linger + 2ms) (the dotted line): at 20ms, 8 callers
// get a fifth or less of their throughput at 0.5ms. Once deliveries fill a
// request before Linger runs out (32 callers and up here), batches leave
// full, throughput no longer depends on Linger and the three p50 lines lie
// on one another: latency then grows with load, queued behind the
// destination's in-flight limit, whatever the Linger. A longer Linger buys
// only slightly fuller requests (the printed entries per request), so keep
// it at what a quiet destination's callers can afford to wait.
//
// Absolute numbers depend on the machine and on what else shares its cores
// (the p99 lines most); the shapes, and where the lines meet, are the point.
package main

import (
	"context"
	"flag"
	"fmt"
	"image/color"
	"io"
	"log"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// The destination every point is measured against.
const (
	requestTime = 2 * time.Millisecond
	maxEntries  = 10 // SQS SendMessageBatch takes at most 10 entries
	maxInflight = 8  // the instance default, Config.SinkConcurrency
)

var (
	// The left panel's Lingers and its fixed load.
	sweepLingers = []time.Duration{
		500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond,
		5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	}
	sweepCallers = []int{8, 64} // fewer than a request's worth, and many more
	// The right panel's loads and Lingers.
	loadCallers = []int{8, 32, 128, 512, 1024}
	loadLingers = []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}
)

// stall is a delivery time worth a warning on stderr: far beyond what
// queueing explains at these loads, it means the machine (or sinkbatch)
// stopped for a while.
const stall = 250 * time.Millisecond

// point is one measurement.
type point struct {
	perSecond  float64 // deliveries answered per second
	p50, p99   time.Duration
	perRequest float64       // entries per request, warm-up included
	slowest    time.Duration // the slowest delivery, warm-up included
}

func main() {
	out := flag.String("out", "docs/linger.png", "PNG file to write")
	window := flag.Duration("window", 300*time.Millisecond, "how long each point is measured in each round, after a warm-up of a third of it")
	rounds := flag.Int("rounds", 3, "rounds over every point; each figure is the median of its rounds")
	flag.Parse()
	log.SetFlags(0)
	start := time.Now()

	// Every point once per round, so that a burst of load from outside hits
	// one round of many points rather than every round of one point.
	var runs []*run
	for _, n := range sweepCallers {
		for _, l := range sweepLingers {
			runs = append(runs, &run{linger: l, callers: n})
		}
	}
	for _, l := range loadLingers {
		for _, n := range loadCallers {
			runs = append(runs, &run{linger: l, callers: n})
		}
	}
	for range *rounds {
		for _, r := range runs {
			p, err := measure(r.linger, r.callers, *window)
			if err != nil {
				log.Fatal(err)
			}
			r.rounds = append(r.rounds, p)
			if p.slowest > stall {
				log.Printf("linger %v, %d callers: a delivery took %v", r.linger, r.callers, p.slowest.Round(time.Millisecond))
			}
		}
	}
	fmt.Printf("%8s %8s %14s %9s %9s %13s\n", "linger", "callers", "deliveries/s", "p50", "p99", "entries/req")
	at := map[[2]int64]point{}
	for _, r := range runs {
		p := r.median()
		at[[2]int64{int64(r.linger), int64(r.callers)}] = p
		fmt.Printf("%8v %8d %14.0f %9v %9v %13.1f\n", r.linger, r.callers, p.perSecond,
			p.p50.Round(10*time.Microsecond), p.p99.Round(10*time.Microsecond), p.perRequest)
	}
	get := func(l time.Duration, n int) point { return at[[2]int64{int64(l), int64(n)}] }
	if err := draw2(*out, throughputPlot(get), latencyPlot(get)); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nwrote %s in %v\n", *out, time.Since(start).Round(time.Second))
}

// run is one point's rounds.
type run struct {
	linger  time.Duration
	callers int
	rounds  []point
}

// median takes each figure's median over the rounds.
func (r *run) median() point {
	med := func(f func(point) float64) float64 {
		v := make([]float64, len(r.rounds))
		for i, p := range r.rounds {
			v[i] = f(p)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return point{
		perSecond:  med(func(p point) float64 { return p.perSecond }),
		p50:        time.Duration(med(func(p point) float64 { return float64(p.p50) })),
		p99:        time.Duration(med(func(p point) float64 { return float64(p.p99) })),
		perRequest: med(func(p point) float64 { return p.perRequest }),
	}
}

// measure runs callers closed-loop callers (each sends its next delivery
// when the last is answered) against a fresh instance for a warm-up and then
// window, and returns what the window saw: the deliveries answered in it.
func measure(linger time.Duration, callers int, window time.Duration) (point, error) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "lingerplot"})
	if err != nil {
		return point{}, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = inst.Stop(ctx)
	}()
	c := fakecodec.New("lingerplot", codec.Limits{MaxEntries: maxEntries, MaxBytes: 256 << 10})
	c.Tune = codec.Tuning{Linger: linger, MaxInflight: maxInflight}
	c.Latency = requestTime
	c.Discard = true
	msg := codec.Message{Tenant: "t", Body: []byte("0123456789abcdef")}

	from := time.Now().Add(window / 3)
	until := from.Add(window)
	var (
		mu      sync.Mutex
		lat     []time.Duration
		failure atomic.Value
		wg      sync.WaitGroup
		sent    atomic.Int64 // deliveries answered, warm-up included
		slowest atomic.Int64
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for {
				t0 := time.Now()
				if t0.After(until) {
					break
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := inst.Deliver(ctx, c, msg)
				cancel()
				if err != nil {
					failure.Store(err)
					return
				}
				sent.Add(1)
				t1 := time.Now()
				for d := int64(t1.Sub(t0)); ; {
					if old := slowest.Load(); d <= old || slowest.CompareAndSwap(old, d) {
						break
					}
				}
				// Count deliveries answered inside the window.
				if !t1.Before(from) && !t1.After(until) {
					mine = append(mine, t1.Sub(t0))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err, _ := failure.Load().(error); err != nil {
		return point{}, fmt.Errorf("linger %v, %d callers: %w", linger, callers, err)
	}
	if len(lat) == 0 {
		// A stall longer than the window: the round shows nothing
		// answered, and the median over rounds decides.
		return point{p50: window, p99: window, slowest: time.Duration(slowest.Load())}, nil
	}
	slices.Sort(lat)
	return point{
		perSecond:  float64(len(lat)) / window.Seconds(),
		p50:        lat[len(lat)/2],
		p99:        lat[len(lat)*99/100],
		perRequest: float64(sent.Load()) / float64(max(c.Requests(), 1)),
		slowest:    time.Duration(slowest.Load()),
	}, nil
}

func ident(v float64) float64 { return v }

// short labels 20000 as 20k.
func short(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprint(v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ticks labels an axis at exactly the values measured.
func ticks[T any](vs []T, value func(T) float64, label func(T) string) plot.ConstantTicks {
	t := make(plot.ConstantTicks, len(vs))
	for i, v := range vs {
		t[i] = plot.Tick{Value: value(v), Label: label(v)}
	}
	return t
}

// model is the left panel's prediction for fewer callers than a request
// holds: they all wait in one batch for Linger, then for the request.
func model(callers int, linger time.Duration) float64 {
	return float64(callers) / (linger + requestTime).Seconds()
}

func throughputPlot(get func(time.Duration, int) point) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Throughput vs Linger, at a fixed load"
	p.X.Label.Text = "Linger (ms, log scale)"
	p.Y.Label.Text = "deliveries answered per second (log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = ticks(sweepLingers, ms, func(d time.Duration) string { return fmt.Sprint(ms(d)) })
	p.Y.Tick.Marker = ticks([]float64{100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5}, ident, short)
	// Room above the curves for the legend.
	p.Y.Min, p.Y.Max = 100, 100e3
	p.Add(plotter.NewGrid())
	for i, n := range sweepCallers {
		xy := make(plotter.XYs, len(sweepLingers))
		for j, l := range sweepLingers {
			xy[j] = plotter.XY{X: ms(l), Y: get(l, n).perSecond}
		}
		line, dots, err := plotter.NewLinePoints(xy)
		if err != nil {
			log.Fatal(err)
		}
		line.Color, dots.Color, dots.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		p.Add(line, dots)
		p.Legend.Add(fmt.Sprintf("%d callers, measured", n), line, dots)
		if n < maxEntries {
			xy := make(plotter.XYs, len(sweepLingers))
			for j, l := range sweepLingers {
				xy[j] = plotter.XY{X: ms(l), Y: model(n, l)}
			}
			m, err := plotter.NewLine(xy)
			if err != nil {
				log.Fatal(err)
			}
			m.Color, m.Dashes = plotutil.Color(i), []vg.Length{vg.Points(2), vg.Points(2)}
			p.Add(m)
			p.Legend.Add(fmt.Sprintf("%d callers, callers / (Linger + %v)", n, requestTime), m)
		}
	}
	p.Legend.Top = true
	return p
}

func latencyPlot(get func(time.Duration, int) point) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Latency vs load (requests take %v, %d entries, %d in flight)", requestTime, maxEntries, maxInflight)
	p.X.Label.Text = "closed-loop callers (log scale)"
	p.Y.Label.Text = "latency of one delivery (ms, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = ticks(loadCallers, func(n int) float64 { return float64(n) }, func(n int) string { return fmt.Sprint(n) })
	p.Y.Tick.Marker = ticks([]float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}, ident, func(v float64) string { return fmt.Sprint(v) })
	p.Y.Min, p.Y.Max = 1, 1000
	p.Add(plotter.NewGrid())
	for i, l := range loadLingers {
		for _, q := range []struct {
			name string
			of   func(point) time.Duration
			dash []vg.Length
		}{
			{"p50", func(pt point) time.Duration { return pt.p50 }, nil},
			{"p99", func(pt point) time.Duration { return pt.p99 }, []vg.Length{vg.Points(5), vg.Points(3)}},
		} {
			xy := make(plotter.XYs, len(loadCallers))
			for j, n := range loadCallers {
				xy[j] = plotter.XY{X: float64(n), Y: ms(q.of(get(l, n)))}
			}
			line, dots, err := plotter.NewLinePoints(xy)
			if err != nil {
				log.Fatal(err)
			}
			line.Color, dots.Color = plotutil.Color(i+2), plotutil.Color(i+2)
			line.Dashes = q.dash
			dots.Shape = plotutil.Shape(i)
			p.Add(line, dots)
			p.Legend.Add(fmt.Sprintf("%s, Linger %v", q.name, l), line, dots)
		}
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p
}

// draw2 writes the two plots side by side into one PNG.
func draw2(path string, left, right *plot.Plot) error {
	img := vgimg.NewWith(vgimg.UseWH(13*vg.Inch, 5*vg.Inch), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	pad := vg.Length(12)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: 2 * pad, PadTop: pad, PadBottom: pad, PadLeft: pad, PadRight: pad}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
