package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
)

// stopTimeout bounds Instance.Stop at the end of the run.
const stopTimeout = 10 * time.Second

// run is the demo: it returns the process's exit code. stdout gets the
// report; stderr the progress line and logs.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	con := newConsole(stderr) // the logger and the progress line share it
	stderr = con
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "demo: -log-level:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.outbox {
		return runOutbox(ctx, o, logger, stdout, stderr)
	}
	if o.cluster != 0 {
		return runCluster(ctx, o, logger, stdout, stderr)
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}

	met, err := newMetrics(o.metricsAddr)
	if err != nil {
		return fail(err)
	}
	defer met.close()

	p := newPlan(o)
	setupCtx, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
	srvs, dests, err := setUp(setupCtx, o, p.idleTimeout)
	cancelSetup()
	if err != nil {
		return fail(err)
	}
	defer srvs.close()

	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "demo", Logger: logger, MeterProvider: met.provider})
	if err != nil {
		return fail(err)
	}
	if err := met.serve(stderr); err != nil {
		stopInstance(inst)
		return fail(err)
	}

	fmt.Fprintf(stdout, "sinkbatch demo: %v of mixed load at %d destinations\n", o.duration, len(dests))
	if srvs.kumo != nil {
		fmt.Fprintf(stdout, "  SQS: kumo at %s\n", srvs.kumo.URL)
	}
	if srvs.pstest != nil {
		fmt.Fprintf(stdout, "  Pub/Sub: pstest at %s\n", srvs.pstest.Addr)
	}
	for _, line := range srvs.external {
		fmt.Fprintf(stdout, "  %s\n", line)
	}
	fmt.Fprintf(stdout, "  poison at %v, burst of %d at %v, codec panic at %v, %s pauses at %v until its batcher has stopped idle\n",
		p.poison.Round(time.Millisecond), p.burstSize, p.burst.Round(time.Millisecond), p.crash.Round(time.Millisecond),
		destAudit, p.pauseFrom.Round(time.Millisecond))

	// The load runs for the duration; then its callers get grace to finish
	// their retries before they give up.
	hard, cancelHard := context.WithCancel(context.Background())
	defer cancelHard()
	l := &load{inst: inst, hard: hard, dests: map[string]*destination{}, special: map[string]*record{}}
	for _, d := range dests {
		l.dests[d.name] = d
	}
	start := time.Now()
	mon := startMonitor(inst, l, con, start)
	loadCtx, cancelLoad := context.WithTimeout(ctx, o.duration)
	l.start(loadCtx, p, o.load, srvs.pstest != nil)
	<-loadCtx.Done()
	cancelLoad()
	// Read while the adaptive batchers still run: a batcher that stops
	// takes its limit off the gauge.
	limits, err := met.limits(context.Background())
	if err != nil {
		return fail(err)
	}
	giveUp := time.AfterFunc(grace, cancelHard)
	l.wg.Wait()
	giveUp.Stop()
	samples := mon.stop()
	con.endProgress()
	elapsed := time.Since(start)

	// Stop: everything has been answered already, so this is quick; its
	// outcome is part of the report.
	t0 := time.Now()
	stopErr := stopInstance(inst)
	stopTook := time.Since(t0)

	readCtx, cancelRead := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelRead()
	stats, err := met.collect(readCtx)
	if err != nil {
		return fail(err)
	}
	rep := report{
		dests: dests, stats: stats, load: l, plan: p, samples: samples, elapsed: elapsed,
		stopErr: stopErr, stopTook: stopTook, limits: limits,
	}
	ok := rep.print(readCtx, stdout)
	if !ok {
		return 1
	}
	return 0
}

// stopInstance stops inst within stopTimeout.
func stopInstance(inst *actors.Instance) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	return inst.Stop(ctx)
}

// sample is the instance's batcher count at one moment of the run.
type sample struct {
	at       time.Duration
	batchers int
}

// monitor prints a progress line each second and samples the batcher count
// ten times a second, so that the idle stop shows in the report.
type monitor struct {
	done    chan struct{}
	stopped chan []sample
}

func startMonitor(inst *actors.Instance, l *load, con *console, start time.Time) *monitor {
	m := &monitor{done: make(chan struct{}), stopped: make(chan []sample, 1)}
	go func() {
		var samples []sample
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last, lastAt := int64(0), start
		next := start.Add(time.Second) // when the next progress line is due
		for {
			select {
			case <-m.done:
				m.stopped <- samples
				return
			case now := <-tick.C:
				s := inst.Stats()
				samples = append(samples, sample{at: now.Sub(start), batchers: s.Batchers})
				if now.Before(next) {
					continue
				}
				for !now.Before(next) {
					next = next.Add(time.Second)
				}
				delivered := l.delivered.Load()
				rate := float64(delivered-last) / now.Sub(lastAt).Seconds()
				last, lastAt = delivered, now
				con.progress(fmt.Sprintf("%3.0fs %5.0f/s  queued=%d inflight=%d refused=%d down=%d retries=%d batchers=%d",
					now.Sub(start).Seconds(), rate, s.Queued, s.InFlight, l.refused.Load(), l.batcherDown.Load(), l.retries.Load(), s.Batchers))
			}
		}
	}()
	return m
}

func (m *monitor) stop() []sample {
	close(m.done)
	return <-m.stopped
}
