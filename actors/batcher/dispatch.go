package batcher

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

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

	// lim is the adaptive in-flight limit (adaptive.go); nil unless
	// Tuning.Adaptive. It sets q.s.maxInflight.
	lim *limiter
	// stretch is the linger under load (linger.go); it sets q.lingerNow
	// from the request times and instance, the instance's requests in
	// flight (Counters.InFlight; nil: never stretch).
	stretch  stretch
	instance *atomic.Int64

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
	// StrictGroups: paused is the answer to an entry of a paused group;
	// resumed, the group its admission resumed (it is the failed entry's
	// retry, or the pause ran out).
	paused  *messages.GroupPausedError
	resumed string
	// WhenFull Block: the entry waits for room (ok is false); stopped, it
	// did not fit while Stop drains, and is answered ErrStopped.
	waiting, stopped bool
	// evicted is a waiter that gave its place to this entry (block.go),
	// to be answered as a refusal.
	evicted *entry
	// pausedRefused is the group a refusal paused (StrictGroups).
	pausedRefused string
	// due: a batch is due now (set when ok).
	due bool
}

// admit queues e at now. When e does not fit, it sweeps the queue for room
// held by callers that gave up or whose deadline passed, and tries once
// more, if a deadline has passed or sweep says so. With StrictGroups an
// entry of a paused group is answered at once (pause.go); with Block an
// entry that still does not fit waits (block.go).
func (d *dispatch) admit(e *entry, now int64, sweep bool) admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return admission{down: true}
	}
	var a admission
	defer d.rescue(&a.dropped)
	resume := false
	if d.q.s.strict {
		if a.paused, resume = d.q.checkPaused(e, now); a.paused != nil {
			return a
		}
	}
	a.reason, a.ok = d.q.admit(e, now)
	if !a.ok && (sweep || now >= d.q.minDeadline || now >= d.q.waits.minDeadline) {
		a.swept = true
		a.dropped = d.q.sweep(now, d.alive)
		a.dropped = append(a.dropped, d.q.sweepWaiters(now, d.alive)...)
		a.dropped = append(a.dropped, d.q.promote(now, d.alive)...)
		a.reason, a.ok = d.q.admit(e, now)
	}
	if !a.ok && d.q.s.block {
		if d.q.draining {
			a.stopped = true
		} else {
			a.waiting = d.q.wait(e)
			if !a.waiting {
				if a.evicted = d.q.evictFor(e); a.evicted != nil {
					a.waiting = d.q.wait(e)
				}
			}
			if !a.waiting {
				// What refuses it now is the waiting list's bound,
				// QueueMax waiters, whatever kept it from the queue.
				a.reason = messages.FullEntries
			}
		}
	}
	// The pause ends only if the retry is in: a retry refused for
	// fullness must not let its followers overtake it.
	if resume && (a.ok || a.waiting) {
		d.q.resume(e.msg.Group)
		a.resumed = e.msg.Group
	}
	if a.ok {
		_, a.due = d.q.due(now)
	}
	if d.q.s.strict {
		// A refused delivery (or the waiter that gave its place) pauses
		// its group for new deliveries (pause.go).
		refused := e
		if a.ok || a.waiting || a.stopped {
			refused = a.evicted
		}
		if refused != nil && refused.msg.Group != "" && d.q.pauseNew(groupFailure{group: refused.msg.Group, key: refused.msg.IdempotencyKey}, now) {
			a.pausedRefused = refused.msg.Group
		}
	}
	return a
}

// setDraining makes the queue send whatever is sendable without waiting
// for Linger (Stop's drain), and returns the deliveries waiting for room,
// which Stop answers ErrStopped.
func (d *dispatch) setDraining() []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.draining = true
	return d.q.drainWaiters()
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
	var dropped []*entry
	defer func() {
		if r := recover(); r != nil {
			took := len(launched) - n
			d.own -= took
			d.goroutines.Add(-int64(took))
			d.down = true
			// What earlier takes of this call dropped is in no lane:
			// the restart must find it to answer it.
			d.q.keep(dropped)
			panic(r)
		}
	}()
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
	r := d.finishWith(f, now, outcome{})
	return r.next, r.dropped, r.panicked
}

// outcome is what a request goroutine learned from its request, for the
// rules: its time and whether it met back pressure (Adaptive), and each
// group's first retryable failure (StrictGroups).
type outcome struct {
	rtt       int64 // nanoseconds
	ok        bool  // the request succeeded as a whole
	pressured bool  // throttled, or out of time
	failures  []groupFailure
}

// finished is what finishWith returns to the request goroutine.
type finished struct {
	next     *inflight
	dropped  []*entry // to be answered as the queue's drops
	panicked any
	held     []heldEntry    // entries of groups that paused, to be answered
	paused   []groupFailure // the groups that paused, to be logged
	limit    int            // the new adaptive limit; 0: unchanged
}

// finishWith is finish for a request whose outcome is known: the failed
// entries' groups pause before their gates open, so that no follower leaves
// in between, and the adaptive limit adjusts before the slot is handed on.
func (d *dispatch) finishWith(f *inflight, now int64, o outcome) (r finished) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			r.next, r.panicked = nil, p
			d.down = true
		}
		if r.next == nil {
			d.own--
			d.goroutines.Add(-1)
		}
	}()
	delete(d.running, f)
	if d.down {
		return r
	}
	if d.q.s.strict {
		for _, g := range o.failures {
			held, paused := d.q.pauseGroup(g, now)
			r.held = append(r.held, held...)
			if paused {
				r.paused = append(r.paused, g)
			}
		}
	}
	d.q.complete(f.groups)
	d.stretch.ended(o.rtt, o.ok)
	if d.lim != nil && d.lim.ended(now, o.rtt, o.ok, o.pressured) {
		d.q.s.maxInflight = d.lim.limit
		r.limit = d.lim.limit
	}
	r.next, r.dropped = d.takeDue(now)
	if len(r.held) > 0 && d.q.waits.n > 0 {
		r.dropped = append(r.dropped, d.q.promote(now, d.alive)...)
	}
	return r
}

// relinger sets how long a batch lingers now (linger.go). d.mu must be
// held.
func (d *dispatch) relinger() {
	if d.instance != nil {
		d.q.lingerNow = d.stretch.wait(d.instance.Load())
	}
}

// takeDue takes the batch due now, if any, and registers it as running.
// The queue counts slots: it never has more than MaxInflight batches out.
// d.mu must be held.
func (d *dispatch) takeDue(now int64) (*inflight, []*entry) {
	if d.down || d.inherited() {
		return nil, nil
	}
	d.relinger()
	trigger, ok := d.q.due(now)
	if !ok {
		return nil, nil
	}
	batch, groups, dropped := d.q.take(now, d.alive)
	if len(batch) == 0 {
		if d.q.waits.n > 0 {
			defer d.rescue(&dropped)
			dropped = append(dropped, d.q.promote(now, d.alive)...)
		}
		return nil, dropped
	}
	if d.lim != nil {
		d.lim.started(d.q.inflight)
	}
	var deadline int64
	for _, e := range batch {
		deadline = max(deadline, e.deadline)
		d.inflightDeadline = min(d.inflightDeadline, e.deadline)
	}
	// No caller waits past the latest deadline, so neither does the request.
	ctx, cancel := context.WithDeadline(context.Background(), timeAt(deadline))
	f := &inflight{entries: batch, claims: make([]atomic.Bool, len(batch)), groups: groups, ctx: ctx, cancel: cancel, trigger: trigger}
	// Registered before promote asks the waiters' callers (their code may
	// panic): the restart finds the batch among the running ones.
	d.running[f] = struct{}{}
	if d.q.waits.n > 0 {
		defer d.rescue(&dropped)
		dropped = append(dropped, d.q.promote(now, d.alive)...)
	}
	return f, dropped
}

// rescue, deferred by a method that gathers entries the queue removed,
// keeps them where the restart finds them if a caller's code (alive)
// panics before the method hands them out, marks the incarnation down and
// lets the panic go on. d.mu must be held.
func (d *dispatch) rescue(removed *[]*entry) {
	if r := recover(); r != nil {
		d.down = true
		d.q.keep(*removed)
		panic(r)
	}
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
	if d.down {
		return nil // the queue may be half changed; the restart answers it
	}
	var dropped []*entry
	defer d.rescue(&dropped)
	dropped = d.q.sweep(now, d.alive)
	if d.q.waits.n > 0 {
		dropped = append(dropped, d.q.sweepWaiters(now, d.alive)...)
		dropped = append(dropped, d.q.promote(now, d.alive)...)
	}
	return dropped
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
	all = append(all, d.q.drainWaiters()...)
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

// pauseHeld pauses, at now, every group with an entry this incarnation
// still holds, keyed by its first (in a request, else queued, else
// waiting), for a crashed incarnation whose entries are all about to be
// answered ErrBatcherDown: their callers retry them, and the group's next
// deliveries must not go out before those retries (StrictGroups). A group
// paused already keeps its pause.
func (d *dispatch) pauseHeld(now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[string]bool{}
	hold := func(e *entry) {
		g := e.msg.Group
		if g == "" || seen[g] {
			return
		}
		seen[g] = true
		d.q.pauseNew(groupFailure{group: g, key: e.msg.IdempotencyKey}, now)
	}
	for f := range d.running {
		for i, e := range f.entries {
			if !f.claims[i].Load() {
				hold(e)
			}
		}
	}
	for _, l := range d.q.groups {
		if l.live > 0 {
			l.skipDead()
			hold(l.entries[l.head])
		}
	}
	for g := range d.q.waits.groups {
		if es := d.q.waits.group(g); len(es) > 0 {
			hold(es[0])
		}
	}
}

// pauses returns a copy of the paused groups, for the next incarnation.
func (d *dispatch) pauses() pauses {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.paused.clone()
}

// seedPauses hands the paused groups of a crashed incarnation to this one,
// before it admits anything.
func (d *dispatch) seedPauses(p pauses) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.paused = p
}

// expirePauses resumes the groups whose pause has run out at now.
func (d *dispatch) expirePauses(now int64) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.expirePauses(now)
}

// resumeGroup resumes group g if it is paused and reports whether it was.
func (d *dispatch) resumeGroup(g string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.resume(g)
}

// resumeGroupIf is resumeGroup if current says, under the same lock, that d
// is still its destination's running incarnation; if not, d has handed its
// pauses on (handPausesTo), nothing is resumed, and ok is false: resume g
// in the next one.
func (d *dispatch) resumeGroupIf(g string, current func() bool) (resumed, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !current() {
		return false, false
	}
	return d.q.resume(g), true
}

// handPausesTo seeds next, the incarnation after d, with d's paused groups
// and makes it the running one (publish), under d's lock: a ResumeGroup
// reaches d before the hand-over, or next after it, never d after it.
func (d *dispatch) handPausesTo(next *dispatch, publish func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	next.seedPauses(d.q.paused.clone())
	publish()
}

// takePausesIf removes and returns the pauses running at now, if current
// still reports d's incarnation running (ok; see resumeGroupIf).
func (d *dispatch) takePausesIf(now int64, current func() bool) (taken []messages.PausedGroup, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !current() {
		return nil, false
	}
	return d.q.takePauses(now), true
}

// adoptPauses pauses the groups another instance handed over (see
// queue.adoptPauses).
func (d *dispatch) adoptPauses(ps []messages.PausedGroup, now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.adoptPauses(ps, now)
}

// pausedGroups lists the groups paused at now, sorted.
func (d *dispatch) pausedGroups(now int64) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.expirePauses(now)
	return d.q.pausedGroups()
}

// status is what the actor reads after each message.
type status struct {
	queued      int
	queuedBytes int64
	inflight    int
	waiting     int
	// held: something is queued, waiting or in flight, or a crashed
	// incarnation's requests still run.
	held bool
	// paused: a group is paused. The batcher must not stop idle (that
	// would forget the pause), but Stop's drain need not wait for it.
	paused bool
	// due: a sweep, an expiry or the end of a pause is due now.
	sweepDue, expireDue, pausesDue bool
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
	d.relinger()
	inherited := d.inherited()
	st := status{
		queued:      q.queued,
		queuedBytes: q.queuedBytes,
		inflight:    q.inflight,
		waiting:     q.waits.n,
		held:        q.queued > 0 || q.inflight > 0 || inherited || q.waits.n > 0,
		paused:      len(q.paused.m) > 0,
		sweepDue:    (q.queued > 0 && now >= q.minDeadline) || (q.waits.n > 0 && now >= q.waits.minDeadline),
		expireDue:   now >= d.inflightDeadline,
		pausesDue:   now >= q.paused.minUntil,
		wake:        q.wake(),
	}
	if inherited && st.wake != 0 {
		// Nothing may go out yet (their ends wake the actor), but
		// deadlines still pass.
		st.wake = 0
		if q.queued > 0 {
			st.wake = q.minDeadline
		}
		if w := min(q.waits.minDeadline, q.paused.minUntil); w != math.MaxInt64 {
			st.wake = minWake(st.wake, w)
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
