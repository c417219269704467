package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// How the demo's callers behave, like a dispatcher's attempts.
const (
	// attemptTimeout bounds one Deliver call: the delivery's deadline.
	attemptTimeout = 5 * time.Second
	// maxAttempts bounds the attempts per message.
	maxAttempts = 40
	// retryBackoff is the pause before retrying after an error that comes
	// with no retry-after.
	retryBackoff = 20 * time.Millisecond
	// grace is how long callers may go on retrying once the load has
	// ended; then they give up.
	grace = 15 * time.Second
)

// outcome is what became of one message.
type outcome int

const (
	pending   outcome = iota // not answered yet
	acked                    // the destination accepted it
	permanent                // refused for good: not retried
	gaveUp                   // out of attempts or time, or the instance stopped
)

// record is one message as its caller saw it. Only its caller writes it;
// it is read after every caller has returned.
type record struct {
	tenant   string
	group    string
	key      string
	submit   time.Time // before the first attempt
	ackAt    time.Time // after the successful attempt returned
	outcome  outcome
	attempts int
	err      error // the last error
}

// load drives the instance: streams of messages per destination and tenant,
// plus the scripted events.
type load struct {
	inst  *actors.Instance
	hard  context.Context // callers give up when it ends
	wg    sync.WaitGroup
	dests map[string]*destination

	delivered   atomic.Int64
	waitingPeak atomic.Int64 // the most deliveries seen waiting for room
	refused     atomic.Int64
	batcherDown atomic.Int64
	retries     atomic.Int64

	mu      sync.Mutex
	special map[string]*record // the poison and crash messages, by key

	// pause is written by runPause before it closes pause.resumed and
	// read by the report once every goroutine of the load has returned.
	pause *pause
}

// stream sends rate messages per second for tenant to d from a pool of
// workers until ctx ends, except while paused says so. The generator waits
// when every worker is busy, so a slow destination slows its producers
// instead of piling up goroutines.
func (l *load) stream(ctx context.Context, d *destination, tenant string, rate float64, workers, groups int, paused func(time.Time) bool) {
	jobs := make(chan codec.Message, workers)
	for range workers {
		l.wg.Go(func() {
			for m := range jobs {
				l.deliver(d, m)
			}
		})
	}
	l.wg.Go(func() {
		defer close(jobs)
		const step = 10 * time.Millisecond
		tick := time.NewTicker(step)
		defer tick.Stop()
		credit, n := 0.0, 0
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if paused != nil && paused(now) {
					credit = 0
					continue
				}
				credit += rate * step.Seconds()
				for ; credit >= 1; credit-- {
					n++
					m := message(d, tenant, fmt.Sprint(n), groups)
					select {
					case jobs <- m:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	})
}

// message makes one of tenant's messages for d. A grouped or ordered
// destination gets one of the tenant's groups, at random.
func message(d *destination, tenant, id string, groups int) codec.Message {
	m := codec.Message{
		Tenant:         tenant,
		IdempotencyKey: d.name + "/" + tenant + "/" + id,
		Body:           fmt.Appendf(nil, `{"tenant":%q,"n":%q,"at":%q}`, tenant, id, time.Now().Format(time.RFC3339Nano)),
		Attributes:     map[string]string{attrTenant: tenant},
	}
	switch {
	case (d.grouped || d.ordered) && groups > 0:
		m.Group = fmt.Sprintf("%s-%d", tenant, rand.IntN(groups))
	case d.grouped:
		m.Group = tenant
	}
	return m
}

// deliver sends m until it is accepted, refused for good, or out of
// attempts, always with the same idempotency key.
func (l *load) deliver(d *destination, m codec.Message) *record {
	r := &record{tenant: m.Tenant, group: m.Group, key: m.IdempotencyKey, submit: time.Now()}
	d.mu.Lock()
	d.records = append(d.records, r)
	d.mu.Unlock()
	for r.attempts < maxAttempts {
		r.attempts++
		ctx, cancel := context.WithTimeout(l.hard, attemptTimeout)
		_, err := l.inst.Deliver(ctx, d.codec, m)
		cancel()
		if err == nil {
			r.outcome, r.ackAt, r.err = acked, time.Now(), nil
			l.delivered.Add(1)
			return r
		}
		r.err = err
		wait := retryBackoff
		var ra *messages.RetryAfterError
		switch {
		case codec.IsPermanent(err):
			r.outcome = permanent
			return r
		case errors.Is(err, messages.ErrStopped):
			r.outcome = gaveUp
			return r
		case errors.As(err, &ra):
			l.refused.Add(1)
			d.refused.Add(1)
			wait = ra.After
		case errors.As(err, new(*messages.GroupPausedError)):
			// An earlier message of its group failed: its caller's retry
			// resumes the group (StrictGroups).
			d.paused.Add(1)
		case errors.Is(err, messages.ErrBatcherDown):
			// It may or may not have been sent: the same key makes the
			// retry safe (a FIFO queue deduplicates on it).
			l.batcherDown.Add(1)
			d.batcherDown.Add(1)
		}
		if r.attempts == maxAttempts || !sleep(l.hard, wait) {
			break
		}
		l.retries.Add(1)
	}
	r.outcome = gaveUp
	return r
}

// sendSpecial sends one marked message on its own caller and keeps its
// record for the report.
func (l *load) sendSpecial(d *destination, m codec.Message) {
	l.wg.Go(func() {
		r := l.deliver(d, m)
		l.mu.Lock()
		l.special[m.IdempotencyKey] = r
		l.mu.Unlock()
	})
}

// burst sends n messages to d at once, from n callers.
func (l *load) burst(d *destination, n int) {
	for i := range n {
		tenant := "burst-" + string(rune('a'+i%2))
		m := message(d, tenant, fmt.Sprint(i), 0)
		l.wg.Go(func() { l.deliver(d, m) })
	}
}

// watchWaiting keeps the most deliveries seen waiting for room
// (Stats().Waiting) while the burst lasts, for the report.
func (l *load) watchWaiting(ctx context.Context) {
	l.wg.Go(func() {
		for range 500 {
			l.waitingPeak.Store(max(l.waitingPeak.Load(), int64(l.inst.Stats().Waiting)))
			if !sleep(ctx, 2*time.Millisecond) {
				return
			}
		}
	})
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// at runs f at the given offset into the load, unless ctx ends first.
func (l *load) at(ctx context.Context, offset time.Duration, f func()) {
	l.wg.Go(func() {
		if sleep(ctx, offset) {
			f()
		}
	})
}

// How many ordinary messages are sent with the poison and with the message
// that crashes its batcher.
const (
	poisonCompanions = 7
	crashCompanions  = 20
)

// plan is the load's schedule, in offsets from its start, scaled to the
// run's duration.
type plan struct {
	poison, burst, crash time.Duration
	// The audit destination pauses at pauseFrom until its batcher has
	// stopped idle and stayed stopped for pauseHold, or for pauseMax at
	// most: waiting for the stop, rather than pausing for a fixed time,
	// shows it even on a machine slow enough to keep requests in flight
	// for seconds.
	pauseFrom, pauseHold, pauseMax time.Duration
	idleTimeout                    time.Duration
	burstSize                      int
}

func newPlan(o options) plan {
	d := o.duration
	idle := min(max(d/15, 200*time.Millisecond), time.Second).Round(10 * time.Millisecond)
	return plan{
		poison:      d * 15 / 100,
		burst:       d * 3 / 10,
		crash:       d * 6 / 10,
		pauseFrom:   d * 3 / 10,
		pauseHold:   2 * idle,
		pauseMax:    d * 6 / 10,
		idleTimeout: idle,
		burstSize:   max(int(400*o.load), 100),
	}
}

// pause is the audit destination's pause as it happened.
type pause struct {
	resumed  chan struct{} // closed when the traffic resumes
	from     time.Duration
	until    time.Duration
	stopSeen bool // the batcher count dropped during the pause
}

// runPause pauses the audit streams (their paused func reads p.resumed)
// and resumes them once the instance runs one batcher fewer than when the
// pause began, pauseHold later, or at pauseFrom+pauseMax. The first message
// after the pause goes out at once: it starts the batcher again.
func (l *load) runPause(ctx context.Context, p plan, t0 time.Time) {
	ps, audit := l.pause, l.dests[destAudit]
	before := l.inst.Stats().Batchers
	ps.from = time.Since(t0)
	end := t0.Add(p.pauseFrom + p.pauseMax)
	for time.Now().Before(end) && l.inst.Stats().Batchers >= before {
		if !sleep(ctx, 10*time.Millisecond) {
			break
		}
	}
	if l.inst.Stats().Batchers < before {
		ps.stopSeen = true
		sleep(ctx, min(p.pauseHold, time.Until(end)))
	}
	ps.until = time.Since(t0)
	close(ps.resumed)
	if ctx.Err() == nil {
		m := message(audit, "a", "resume", 0)
		l.wg.Go(func() { l.deliver(audit, m) })
	}
}

// start launches every stream and scripted event; they run until ctx ends.
func (l *load) start(ctx context.Context, p plan, scale float64, poison bool) {
	t0 := time.Now()
	rate := func(r float64) float64 { return r * scale }
	tenants := []struct {
		name            string
		rate            float64
		workers, groups int
	}{
		{"a", 80, 8, 4},
		{"b", 80, 8, 4},
		{"c", 80, 8, 4},
		{"flood", 600, 48, 8},
	}
	for _, name := range []string{destOrders, destEvents, destPSOrders} {
		for _, t := range tenants {
			l.stream(ctx, l.dests[name], t.name, rate(t.rate), t.workers, t.groups, nil)
		}
	}
	audit := l.dests[destAudit]
	l.pause = &pause{resumed: make(chan struct{})}
	paused := func(now time.Time) bool {
		select {
		case <-l.pause.resumed:
			return false
		default:
			return now.Sub(t0) >= p.pauseFrom
		}
	}
	l.at(ctx, p.pauseFrom, func() { l.runPause(ctx, p, t0) })
	l.stream(ctx, audit, "a", rate(60), 4, 0, paused)
	l.stream(ctx, audit, "b", rate(60), 4, 0, paused)
	// A trickle keeps the burst destination's batcher running.
	l.stream(ctx, l.dests[destBurst], "a", rate(20), 2, 0, nil)
	for _, t := range tenants[:2] {
		l.stream(ctx, l.dests[destStrict], t.name, rate(t.rate), t.workers, t.groups, nil)
		l.stream(ctx, l.dests[destAdaptive], t.name, rate(t.rate), t.workers, t.groups, nil)
	}
	l.stream(ctx, l.dests[destBlock], "a", rate(20), 2, 0, nil)

	if poison {
		// The poison goes with companions sent at the same instant, so
		// that it shares a batch the batcher has to bisect.
		l.at(ctx, p.poison, func() {
			for i := range poisonCompanions {
				m := message(audit, "b", fmt.Sprint("companion-", i), 0)
				l.wg.Go(func() { l.deliver(audit, m) })
			}
			m := message(audit, "a", "poison", 0)
			m.IdempotencyKey = poisonKey
			m.Attributes[attrPoison] = "true"
			l.sendSpecial(audit, m)
		})
	}
	l.at(ctx, p.burst, func() { l.burst(l.dests[destBurst], p.burstSize) })
	l.at(ctx, p.burst, func() {
		l.burst(l.dests[destBlock], p.burstSize)
		l.watchWaiting(ctx)
	})
	l.at(ctx, p.crash, func() {
		// Companions first, so that the batcher holds more than the
		// marked message when its codec panics: none of them may be
		// answered for it.
		events := l.dests[destEvents]
		for i := range crashCompanions {
			m := message(events, "c", fmt.Sprint("companion-", i), 0)
			l.wg.Go(func() { l.deliver(events, m) })
		}
		m := message(events, "a", "crash", 0)
		m.IdempotencyKey = crashKey
		l.sendSpecial(events, m)
	})
}
