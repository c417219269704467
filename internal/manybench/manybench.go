// Package manybench drives the ManyDestinations benchmarks: many callers,
// each moving to another destination after each message, publishing through
// sinkbatch and through a peer in alternating rounds, with what the server
// saw of each side's requests.
package manybench

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Shape is a benchmark's set-up.
type Shape struct {
	Destinations int
	Callers      int
	Rounds       int           // measured rounds per side; the sides alternate ABBA
	Body         int           // bytes in a message body, the send-time stamp included
	Probe        time.Duration // the timer the probe arms, the Linger and delay of both sides
}

// Send publishes body to destination dest for caller and returns the
// message's id (or, for a peer that gives none, any non-empty string).
type Send func(caller, dest int, body []byte) (string, error)

// Side is one way to publish.
type Side struct {
	Name string
	Send Send

	rounds []round
	late   []float64 // the timer probe's lateness, seconds
	step   []int     // each caller's next message number, across rounds
}

// round is what one round of a side took and what the server saw.
type round struct {
	msgs      int
	wall, cpu time.Duration
	seen      Counts
}

func (r round) rate() float64   { return float64(r.msgs) / r.wall.Seconds() }
func (r round) cpuPer() float64 { return float64(r.cpu.Microseconds()) / float64(r.msgs) }

// Counts are what a server saw of requests.
type Counts struct {
	Requests, Msgs int64
	Spread         time.Duration // sum over requests of the spread of their messages' send times
	Oldest         time.Duration // sum over requests of their oldest message's age on arrival
}

func (c Counts) minus(d Counts) Counts {
	return Counts{c.Requests - d.Requests, c.Msgs - d.Msgs, c.Spread - d.Spread, c.Oldest - d.Oldest}
}

// Counter counts requests at the server, reading the send time that Stamp
// wrote into each message. Safe for concurrent use.
type Counter struct {
	base time.Time
	mu   sync.Mutex
	c    Counts
}

// NewCounter returns a Counter whose clock starts now.
func NewCounter() *Counter { return &Counter{base: time.Now()} }

// Stamp writes the send time into body's first 16 bytes, as digits.
func (p *Counter) Stamp(body []byte) {
	var digits [16]byte
	s := strconv.AppendInt(digits[:0], int64(time.Since(p.base)), 10)
	copy(body, "0000000000000000"[:16-len(s)])
	copy(body[16-len(s):], s)
}

// SentAt reads the send time Stamp wrote into body; ok is false if body
// holds none.
func SentAt(body []byte) (time.Duration, bool) {
	if len(body) < 16 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(body[:16]), 10, 64)
	return time.Duration(n), err == nil
}

// Request counts one request whose messages carry bodies.
func (p *Counter) Request(bodies [][]byte) {
	now := time.Since(p.base)
	var first, last time.Duration = -1, -1
	for _, b := range bodies {
		if t, ok := SentAt(b); ok {
			if first < 0 || t < first {
				first = t
			}
			last = max(last, t)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.c.Requests++
	p.c.Msgs += int64(len(bodies))
	if first >= 0 {
		p.c.Spread += last - first
		p.c.Oldest += now - first
	}
}

func (p *Counter) snapshot() Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.c
}

// Run warms both sides up, measures them in alternating rounds of b.N/Rounds
// messages each, clearing the server after each round, and reports per side
// msgs/s, CPU per message (user+sys of the whole process, the in-process
// server included), messages per request, how far apart its requests'
// messages were sent (open-ms, mean) and how old a request's oldest message
// was on arrival (oldest-ms, mean), and the median lateness of a probe's
// timers while it ran (timer-late-ms); then sinkbatch's ratios to the peer,
// the median of the paired rounds with their range.
func Run(b *testing.B, sh Shape, count *Counter, clear func(), sinkbatch, peer *Side) {
	for _, x := range []*Side{peer, sinkbatch} {
		x.round(b, sh, count, 4*sh.Destinations) // every destination's first messages, untimed
		clear()
		x.rounds, x.late = nil, nil
	}
	per := max(b.N/sh.Rounds, 1)
	b.ResetTimer()
	for r := range sh.Rounds {
		order := []*Side{peer, sinkbatch}
		if r%2 == 1 {
			order = []*Side{sinkbatch, peer}
		}
		for _, x := range order {
			x.round(b, sh, count, per)
			clear()
		}
	}
	b.StopTimer()

	var rates, cpus []float64
	for r := range sh.Rounds {
		s, p := sinkbatch.rounds[r], peer.rounds[r]
		rates = append(rates, s.rate()/p.rate())
		cpus = append(cpus, s.cpuPer()/p.cpuPer())
	}
	for _, x := range []*Side{sinkbatch, peer} {
		var t round
		for _, r := range x.rounds {
			t.msgs += r.msgs
			t.wall += r.wall
			t.cpu += r.cpu
			t.seen.Requests += r.seen.Requests
			t.seen.Msgs += r.seen.Msgs
			t.seen.Spread += r.seen.Spread
			t.seen.Oldest += r.seen.Oldest
		}
		n := float64(t.seen.Requests)
		b.ReportMetric(t.rate(), x.Name+"-msgs/s")
		b.ReportMetric(t.cpuPer(), x.Name+"-cpu-µs/msg")
		b.ReportMetric(float64(t.seen.Msgs)/n, x.Name+"-msgs/req")
		b.ReportMetric(t.seen.Spread.Seconds()*1e3/n, x.Name+"-open-ms")
		b.ReportMetric(t.seen.Oldest.Seconds()*1e3/n, x.Name+"-oldest-ms")
		b.ReportMetric(Median(x.late)*1e3, x.Name+"-timer-late-ms")
	}
	b.ReportMetric(Median(rates), "rate-ratio-median")
	b.ReportMetric(slices.Min(rates), "rate-ratio-min")
	b.ReportMetric(slices.Max(rates), "rate-ratio-max")
	b.ReportMetric(Median(cpus), "cpu-ratio-median")
	b.ReportMetric(slices.Min(cpus), "cpu-ratio-min")
	b.ReportMetric(slices.Max(cpus), "cpu-ratio-max")
}

// round sends n messages from sh.Callers callers, caller c sending its k-th
// message (counted across rounds) to destination (c+k) mod
// sh.Destinations, and records what that took.
func (x *Side) round(b *testing.B, sh Shape, count *Counter, n int) {
	if x.step == nil {
		x.step = make([]int, sh.Callers)
	}
	runtime.GC()
	stop := make(chan struct{})
	probed := make(chan []float64)
	go func() { probed <- probeTimers(sh.Probe, stop) }()
	before := count.snapshot()
	var (
		next, failed atomic.Int64
		first        atomic.Value
		wg           sync.WaitGroup
	)
	cpu0, t0 := usage(b), time.Now()
	for c := range sh.Callers {
		wg.Go(func() {
			body := make([]byte, sh.Body)
			for i := range body {
				body[i] = 'x'
			}
			for int(next.Add(1)) <= n {
				dest := (c + x.step[c]) % sh.Destinations
				x.step[c]++
				count.Stamp(body)
				if id, err := x.Send(c, dest, body); err != nil || id == "" {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprint(err))
				}
			}
		})
	}
	wg.Wait()
	wall, cpu := time.Since(t0), usage(b)-cpu0
	close(stop)
	x.late = append(x.late, <-probed...)
	if failed.Load() != 0 {
		b.Fatalf("%s: %d failed; the first: %v", x.Name, failed.Load(), first.Load())
	}
	seen := count.snapshot().minus(before)
	if seen.Msgs != int64(n) {
		b.Fatalf("%s: the server got %d messages for %d sent", x.Name, seen.Msgs, n)
	}
	x.rounds = append(x.rounds, round{msgs: n, wall: wall, cpu: cpu, seen: seen})
}

// probeTimers arms timers of d one after another until stop is closed and
// returns how late each fired, in seconds.
func probeTimers(d time.Duration, stop <-chan struct{}) []float64 {
	var late []float64
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t0 := time.Now()
		t.Reset(d)
		select {
		case <-stop:
			return late
		case <-t.C:
			late = append(late, (time.Since(t0) - d).Seconds())
		}
	}
}

// usage is the process's user+sys CPU time so far.
func usage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Median is the median of xs, which it sorts; 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
