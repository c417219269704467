package batcher

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// dispatch is the state a batcher's actor shares with its request
// goroutines: the queue, the requests running and the slots they hold. A
// request goroutine whose request ends takes the batch due next for its own
// slot (finish), so that a busy destination's slot goes on at once instead
// of waiting for the actor's turn to run; the batch is taken then, not
// earlier, so that a tenant that turned up meanwhile is in the same
// round-robin. Every method takes mu, and nothing else touches the fields
// it guards.
//
// One dispatch serves one incarnation of the actor. When the incarnation
// crashes it is down: its goroutines finish their requests but take
// nothing more (the queue may be half changed), and the next incarnation,
// with a dispatch of its own, sends nothing while they run.
type dispatch struct {
	mu sync.Mutex
	q  *queue
	// running holds the batches whose request is running.
	running map[*inflight]struct{}
	// own counts this incarnation's request goroutines.
	own  int
	down bool
	// inflightDeadline: no unclaimed entry in a request has an earlier
	// deadline; MaxInt64 when none.
	inflightDeadline int64

	// Set by newDispatch, never changed.
	goroutines *atomic.Int64 // request goroutines of every incarnation (Params)
	alive      func(*entry) bool
}

// inflight is a batch whose request is running. Each of its callers is
// answered exactly once, by whoever first sets its claim: the request
// goroutine with the result, or the actor when the caller's deadline passes
// first, or when it restarts, aborts or stops.
type inflight struct {
	entries []*entry
	claims  []atomic.Bool // claims[i] is set once entries[i]'s caller is answered
	groups  []*lane
	ctx     context.Context
	cancel  context.CancelFunc
	trigger telemetry.Trigger
}

func newDispatch(q *queue, goroutines *atomic.Int64, alive func(*entry) bool) *dispatch {
	return &dispatch{
		q:                q,
		running:          make(map[*inflight]struct{}),
		inflightDeadline: math.MaxInt64,
		goroutines:       goroutines,
		alive:            alive,
	}
}

// admission is what admit did with an entry.
type admission struct {
	ok      bool
	reason  messages.FullReason // the bound that refused it, when !ok
	down    bool                // the incarnation is down: nothing was done
	swept   bool                // the queue was swept for room
	dropped []*entry            // what the sweep removed, to be answered
}

// admit queues e at now. When e does not fit, it sweeps the queue for room
// held by callers that gave up or whose deadline passed, and tries once
// more, if a deadline has passed or sweep says so.
func (d *dispatch) admit(e *entry, now int64, sweep bool) admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return admission{down: true}
	}
	reason, ok := d.q.admit(e, now)
	if ok {
		return admission{ok: true}
	}
	if !sweep && now < d.q.minDeadline {
		return admission{reason: reason}
	}
	a := admission{swept: true, dropped: d.q.sweep(now, d.alive)}
	a.reason, a.ok = d.q.admit(e, now)
	return a
}

// setDraining makes the queue send whatever is sendable without waiting
// for Linger (Stop's drain).
func (d *dispatch) setDraining() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.draining = true
}

// launchLocked takes the batch due now, if any, registers it as running
// and counts the goroutine that will run it. It also returns the entries
// the take dropped, to be answered. d.mu must be held.
func (d *dispatch) launchLocked(now int64) (*inflight, []*entry) {
	f, dropped := d.takeDue(now)
	if f != nil {
		d.own++
		d.goroutines.Add(1)
	}
	return f, dropped
}

// step is what the actor does after each message, under one lock: launch
// every batch due now (appended to launched), and read the status after.
//
// If a take panics (alive is the caller's code), the batches this call
// took have no goroutine yet: their count is taken back, so that the next
// incarnation does not wait for goroutines that never ran, and they stay
// in running, so that the restart answers their callers. The panic goes on
// to Receive.
func (d *dispatch) step(now int64, launched []*inflight) ([]*inflight, []*entry, status) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(launched)
	defer func() {
		if r := recover(); r != nil {
			took := len(launched) - n
			d.own -= took
			d.goroutines.Add(-int64(took))
			d.down = true
			panic(r)
		}
	}()
	var dropped []*entry
	for {
		f, more := d.launchLocked(now)
		dropped = append(dropped, more...)
		if f == nil {
			break
		}
		launched = append(launched, f)
	}
	return launched, dropped, d.statusLocked(now)
}

// finish ends f's request and hands its slot on: it returns the batch due
// now, for the calling goroutine to send next, or nil when the goroutine
// should end. A panic in the rules here (alive is the caller's code) would
// end the process on a request goroutine: it is returned instead, the
// incarnation is down, and the goroutine ends.
func (d *dispatch) finish(f *inflight, now int64) (next *inflight, dropped []*entry, panicked any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			next, panicked = nil, r
			d.down = true
		}
		if next == nil {
			d.own--
			d.goroutines.Add(-1)
		}
	}()
	delete(d.running, f)
	if d.down {
		return nil, nil, nil
	}
	d.q.complete(f.groups)
	next, dropped = d.takeDue(now)
	return next, dropped, nil
}

// takeDue takes the batch due now, if any, and registers it as running.
// The queue counts slots: it never has more than MaxInflight batches out.
// d.mu must be held.
func (d *dispatch) takeDue(now int64) (*inflight, []*entry) {
	if d.down || d.inherited() {
		return nil, nil
	}
	trigger, ok := d.q.due(now)
	if !ok {
		return nil, nil
	}
	batch, groups, dropped := d.q.take(now, d.alive)
	if len(batch) == 0 {
		return nil, dropped
	}
	var deadline int64
	for _, e := range batch {
		deadline = max(deadline, e.deadline)
		d.inflightDeadline = min(d.inflightDeadline, e.deadline)
	}
	// No caller waits past the latest deadline, so neither does the request.
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, deadline))
	f := &inflight{entries: batch, claims: make([]atomic.Bool, len(batch)), groups: groups, ctx: ctx, cancel: cancel, trigger: trigger}
	d.running[f] = struct{}{}
	return f, dropped
}

// inherited reports whether request goroutines of an incarnation that
// crashed are still running. Their requests were cancelled, but a codec may
// take a while to notice; until they end this incarnation sends nothing, so
// that MaxInflight and each group's single request in flight hold across a
// restart. Each of them tells the actor when it ends. d.mu must be held.
func (d *dispatch) inherited() bool {
	return d.goroutines.Load() > int64(d.own)
}

// sweep removes every queued entry whose deadline has passed or whose
// caller is gone, and returns them.
func (d *dispatch) sweep(now int64) []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.sweep(now, d.alive)
}

// expire claims every entry in a request whose deadline has passed and
// returns them, for the actor to answer: a caller is never answered later
// than its deadline, though its request cannot be recalled. It costs
// O(entries in flight) and runs only when the earliest such deadline has
// passed.
func (d *dispatch) expire(now int64) []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	var late []*entry
	next := int64(math.MaxInt64)
	for f := range d.running {
		for i, e := range f.entries {
			if f.claims[i].Load() {
				continue
			}
			if e.deadline <= now {
				if f.claims[i].CompareAndSwap(false, true) {
					late = append(late, e)
				}
				continue
			}
			next = min(next, e.deadline)
		}
	}
	d.inflightDeadline = next
	return late
}

// abandon removes every queued entry and claims every entry in a request,
// cancelling the requests, and returns them all, for an actor that answers
// everything it holds at once (restart, abort, stop). The requests keep
// their slots until their goroutines end.
func (d *dispatch) abandon() []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	all := d.q.drainAll()
	for f := range d.running {
		for i, e := range f.entries {
			if f.claims[i].CompareAndSwap(false, true) {
				all = append(all, e)
			}
		}
		f.cancel()
	}
	return all
}

// markDown ends the incarnation's taking: see dispatch.
func (d *dispatch) markDown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
}

// status is what the actor reads after each message.
type status struct {
	queued      int
	queuedBytes int64
	inflight    int
	// held: something is queued or in flight, or a crashed incarnation's
	// requests still run.
	held bool
	// due: a sweep or an expiry is due now.
	sweepDue, expireDue bool
	// wake is the next time the actor must look without a message: Linger
	// running out, a deadline passing; 0: none.
	wake int64
}

func (d *dispatch) status(now int64) status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.statusLocked(now)
}

func (d *dispatch) statusLocked(now int64) status {
	q := d.q
	inherited := d.inherited()
	st := status{
		queued:      q.queued,
		queuedBytes: q.queuedBytes,
		inflight:    q.inflight,
		held:        q.queued > 0 || q.inflight > 0 || inherited,
		sweepDue:    q.queued > 0 && now >= q.minDeadline,
		expireDue:   now >= d.inflightDeadline,
		wake:        q.wake(),
	}
	if inherited && st.wake != 0 {
		// Nothing may go out yet (their ends wake the actor), but
		// deadlines still pass.
		st.wake = 0
		if q.queued > 0 {
			st.wake = q.minDeadline
		}
	}
	if len(d.running) > 0 && d.inflightDeadline != math.MaxInt64 {
		st.wake = minWake(st.wake, d.inflightDeadline)
	}
	return st
}

// minWake is the earlier of two wake times, 0 meaning none.
func minWake(a, b int64) int64 {
	if a == 0 {
		return b
	}
	return min(a, b)
}
