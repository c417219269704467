package batcher

import (
	"context"
	"github.com/ankusa/sinkbatch/internal/mono"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ankusa/sinkbatch/codec"
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

func newDispatch(q *queue, goroutines *atomic.Int64) *dispatch {
	return &dispatch{
		q:                q,
		running:          make(map[*inflight]struct{}),
		inflightDeadline: math.MaxInt64,
		goroutines:       goroutines,
	}
}

// admission is what admit did with an entry.
type admission struct {
	ok      bool
	reason  messages.FullReason // the bound that refused it, when !ok
	down    bool                // the incarnation is down: nothing was done
	swept   bool                // the queue was swept for room
	dropped []*entry            // what the sweep removed, and entries held back by a pause, to be answered
	// StrictGroups: paused, the entry's group is paused and it is not the
	// retry the group waits for next, whose key waitFor is; resumed, the
	// group its admission resumed (it was the last retry the group waited
	// for).
	paused  bool
	waitFor string
	resumed string
	// WhenFull Block: the entry waits for room (ok is false); stopped, it
	// did not fit while Stop drains, and is answered ErrStopped.
	waiting, stopped bool
	// evicted is a waiter that gave its place to this entry (block.go),
	// to be answered as a refusal.
	evicted *entry
	// pausedRefused lists the groups a refusal paused (StrictGroups).
	pausedRefused []string
	// due: a batch is due now (set when ok).
	due bool
	// ask: e did not fit and nothing was done yet; these queued and
	// waiting entries' callers may have left without a word (an actor's
	// future that timed out). The driver asks about them outside the lock
	// and finishes with admitSwept.
	ask []*entry
	// Carried from admit to admitSwept.
	retry bool
}

// admit queues e at now. When e does not fit, it sweeps the queue for room
// held by callers that gave up or whose deadline passed, and tries once
// more, if a deadline has passed or sweep says so. With StrictGroups an
// entry of a paused group is answered at once unless it is the retry the
// group waits for next (pause.go); with Block an entry that does not fit,
// or finds others waiting, waits (block.go).
func (d *dispatch) admit(e *entry, now int64, sweep bool) admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return admission{down: true}
	}
	var a admission
	defer d.rescue(&a.dropped)
	g := e.msg.Group
	retry := false
	if d.q.s.strict && g != "" {
		var rank uint64
		if a.waitFor, a.paused, retry, rank = d.q.checkPaused(g, e.msg.IdempotencyKey, now); a.paused && !retry {
			d.q.owe(e)
			return a
		}
		a.paused = false
		e.rank = rank
	}
	if !retry {
		e.rank = d.q.newRank()
	}
	if e.silent() {
		d.q.silentSeen = true
	}
	a.reason, a.ok = d.q.admit(e, now)
	a.retry = retry
	if !a.ok && sweep {
		if a.ask = d.q.silent(); len(a.ask) > 0 {
			return a
		}
	}
	return d.admitRest(e, now, sweep, a)
}

// admitSwept finishes the admission of e that admit left to the driver
// (admission.ask): gone lists the entries of ask whose callers left. They
// are dropped with the sweep that looks for e's room.
func (d *dispatch) admitSwept(e *entry, now int64, a admission, gone []*entry) admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return admission{down: true}
	}
	a.ask = nil
	defer d.rescue(&a.dropped)
	markLeft(gone)
	return d.admitRest(e, now, true, a)
}

// markLeft sets the left flag of gone, entries whose callers have no Room
// to say they left with, which the driver found gone (see silent). Some may
// have left the queue meanwhile (taken into a request): the flag changes
// nothing there. d.mu must be held.
func markLeft(gone []*entry) {
	for _, x := range gone {
		if x.left == nil {
			x.left = leftWord
		}
	}
}

// silent returns the queued and waiting entries whose callers can say
// nothing of their leaving (queue.silent), for the driver to ask about
// outside the lock and hand to sweepGone; nil once down.
func (d *dispatch) silent() []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down || d.q.queued+d.q.waits.n == 0 {
		return nil
	}
	return d.q.silent()
}

// admitRest is admit from e's first try onward: a sweep for room if that
// failed, a second try, then waiting (Block) or refusal. d.mu must be held.
func (d *dispatch) admitRest(e *entry, now int64, sweep bool, a admission) admission {
	g := e.msg.Group
	retry := a.retry
	if !a.ok && (sweep || now >= d.q.minDeadline || now >= d.q.waits.minDeadline) {
		a.swept = true
		a.dropped = d.q.sweep(now)
		a.dropped = append(a.dropped, d.q.sweepWaiters(now)...)
		a.dropped = append(a.dropped, d.q.promote(now)...)
		if d.q.s.strict && g != "" {
			// The sweep may have paused e's group (an older entry of it
			// expired or its caller left): e is held as any delivery to
			// a paused group is, or is the retry it now waits for.
			var rank uint64
			var paused bool
			if a.waitFor, paused, retry, rank = d.q.checkPaused(g, e.msg.IdempotencyKey, now); paused && !retry {
				d.q.owe(e)
				a.paused = true
				return a
			}
			if retry {
				e.rank = rank
			}
		}
		a.reason, a.ok = d.q.admit(e, now)
	}
	if !a.ok && d.q.s.block {
		switch {
		case d.q.draining:
			a.stopped = true
		default:
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
				break
			}
			// Its turn may be now.
			a.dropped = append(a.dropped, d.q.promote(now)...)
			if e.lane != nil {
				a.ok, a.waiting = true, false
			}
		}
	}
	// A retry that a pause took out again as it waited (heldBy) was not
	// admitted.
	if retry && (a.ok || a.waiting) && e.heldBy == "" && d.q.admitted(g, e.msg.IdempotencyKey) {
		a.resumed = g
	}
	if a.ok {
		_, a.due = d.q.due(now)
	}
	// A refusal leaves the refused message's fate to its caller, and so
	// does the eviction of a waiter: their groups pause (pause.go).
	var refused []*entry
	if !a.ok && !a.waiting && !a.stopped {
		refused = append(refused, e)
	}
	if a.evicted != nil {
		refused = append(refused, a.evicted)
	}
	if len(refused) > 0 {
		var held []*entry
		held, a.pausedRefused = d.q.interrupt(refused, now)
		a.dropped = append(a.dropped, held...)
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
// If a take panics (a fault in the rules), the batches this call
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

// outcome is what a request goroutine learned from its request, for the
// rules: its time and whether it met back pressure (Adaptive), and each
// entry's result (StrictGroups).
type outcome struct {
	// skipped: no request was made (every entry's caller had left); the
	// request times learn nothing from it.
	skipped   bool
	rtt       int64 // nanoseconds
	ok        bool  // the request succeeded as a whole
	pressured bool  // throttled, or out of time
	// results[i] is f.entries[i]'s result; nil: all succeeded.
	results []codec.Result
	// won, if long enough, is where finishWith marks the entries whose
	// answer is the goroutine's; nil: it allocates.
	won []bool
}

// finished is what finishWith returns to the request goroutine.
type finished struct {
	next     *inflight
	dropped  []*entry // to be answered as the queue's drops (held entries among them)
	panicked any
	// won[i]: the goroutine answers f.entries[i] (no one else has).
	won    []bool
	held   []*entry // entries of groups that paused, to be answered GroupPausedError
	paused []string // the groups that paused, to be logged
	limit  int      // the new adaptive limit; 0: unchanged
}

// finishWith ends f's request and hands its slot on: it claims the
// entries whose callers nobody answered yet (won), pauses the groups whose
// entries failed retryably before their gates open (pause.go), so that no
// follower leaves in between, adjusts the adaptive limit, and returns the
// batch due now for the calling goroutine to send next, or nil when the
// goroutine should end. A panic in the rules here would end the process
// on a request goroutine: it is returned instead, the incarnation is down,
// and the goroutine ends.
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
	n := len(f.entries)
	r.won = o.won
	if len(r.won) < n {
		r.won = make([]bool, n)
	}
	r.won = r.won[:n]
	clear(r.won)
	if d.down {
		// The queue may be half changed. f stays running: the restart
		// (abandon) claims its entries, answers them and pauses their
		// groups, whether it comes before this or after.
		return r
	}
	delete(d.running, f)
	var failed []*entry
	for i, e := range f.entries {
		// Claimed already: expired in flight.
		r.won[i] = f.claims[i].CompareAndSwap(false, true)
		if r.won[i] && d.q.s.strict && e.msg.Group != "" && i < len(o.results) {
			if err := o.results[i].Err; err != nil && !codec.IsPermanent(err) {
				failed = append(failed, e)
			}
		}
	}
	r.held, r.paused = d.q.interrupt(failed, now)
	d.q.complete(f.groups)
	if !o.skipped {
		d.stretch.ended(o.rtt, o.ok)
	}
	if d.lim != nil && !o.skipped && d.lim.ended(now, o.rtt, o.ok, o.pressured) {
		d.q.s.maxInflight = d.lim.limit
		r.limit = d.lim.limit
	}
	r.next, r.dropped = d.takeDue(now)
	if len(r.held) > 0 && d.q.waits.n > 0 {
		r.dropped = append(r.dropped, d.q.promote(now)...)
	}
	return r
}

// leave takes out of f, before its request is made, the entries whose
// callers left (gone[i], which the request goroutine found outside the
// lock: a caller's code is never called under it). They are not sent, and
// are returned with the entries to answer (answerDropped tells their
// Listeners Forgotten). With StrictGroups a caller that left interrupts
// its group (pause.go): the group's later entries in f are not sent either
// but held, as are those it has queued and waiting; a later one the actor
// claimed already (expired in flight, answered) is taken out unanswered.
// An entry the actor claimed already whose own caller left stays, as it
// would have if its caller had left after the request began.
func (d *dispatch) leave(f *inflight, gone []bool, now int64) (dropped []*entry, panicked any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil, nil // f stays whole: the restart answers it
	}
	defer func() {
		// A fault in the rules on a request goroutine, as in finishWith:
		// it is returned, the incarnation is down, and f, which changes
		// only once the rules are done, is whole for the restart.
		if p := recover(); p != nil {
			dropped, panicked = nil, p
			d.down = true
		}
	}()
	var stopped map[string]bool // groups whose entry in f left
	var interrupted, held []*entry
	out := make([]bool, len(f.entries)) // taken out of f
	for i, e := range f.entries {
		claimed := f.claims[i].Load()
		g := e.msg.Group
		strict := d.q.s.strict && g != ""
		switch {
		case gone[i] && !claimed:
			out[i] = true
			dropped = append(dropped, e)
			if strict {
				if stopped == nil {
					stopped = make(map[string]bool)
				}
				stopped[g] = true
				interrupted = append(interrupted, e)
			}
		case strict && stopped[g]:
			// A follower the actor answered already (expired in flight)
			// is not sent either: it would be stored before the left
			// entry's retry. Its answer said it may have been stored.
			out[i] = true
			if !claimed {
				held = append(held, e)
			}
			interrupted = append(interrupted, e)
		}
	}
	if len(interrupted) > 0 {
		queued, _ := d.q.interrupt(interrupted, now)
		for _, e := range held {
			e.heldBy = d.q.paused.m[e.msg.Group].keys[0].key
		}
		dropped = append(append(dropped, held...), queued...)
		if len(queued) > 0 && d.q.waits.n > 0 {
			dropped = append(dropped, d.q.promote(now)...)
		}
	}
	k := 0
	for i, e := range f.entries {
		if out[i] {
			continue
		}
		f.entries[k] = e
		f.claims[k].Store(f.claims[i].Load())
		k++
	}
	clear(f.entries[k:])
	f.entries, f.claims = f.entries[:k], f.claims[:k]
	return dropped, nil
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
	batch, groups, dropped := d.q.take(now)
	if len(batch) == 0 {
		if d.q.waits.n > 0 {
			defer d.rescue(&dropped)
			dropped = append(dropped, d.q.promote(now)...)
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
	ctx, cancel := context.WithDeadline(context.Background(), mono.Time(deadline))
	f := &inflight{entries: batch, claims: make([]atomic.Bool, len(batch)), groups: groups, ctx: ctx, cancel: cancel, trigger: trigger}
	// Registered before promote runs: if the rules panic, the restart
	// finds the batch among the running ones.
	d.running[f] = struct{}{}
	if d.q.waits.n > 0 {
		defer d.rescue(&dropped)
		dropped = append(dropped, d.q.promote(now)...)
	}
	return f, dropped
}

// rescue, deferred by a method that gathers entries the queue removed,
// keeps them where the restart finds them if the rules panic before the
// method hands them out, marks the incarnation down and
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

// sweepGone removes every queued or waiting entry whose deadline has
// passed or whose caller is gone, and returns them. gone are entries of
// silent whose callers the driver found gone, outside the lock: they are
// dropped with the others (a waiter among them passes its turn on).
func (d *dispatch) sweepGone(now int64, gone []*entry) []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil // the queue may be half changed; the restart answers it
	}
	markLeft(gone)
	var dropped []*entry
	defer d.rescue(&dropped)
	dropped = d.q.sweep(now)
	if d.q.waits.n > 0 {
		dropped = append(dropped, d.q.sweepWaiters(now)...)
		dropped = append(dropped, d.q.promote(now)...)
	}
	return dropped
}

// expire claims every entry in a request whose deadline has passed and
// returns them (late), for the actor to answer: a caller is never answered
// later than its deadline, though its request cannot be recalled. Their
// groups pause (pause.go): held are the entries they hold back, and the
// waiters found abandoned as the room those freed goes to the others, to be
// answered too (answerDropped). It costs O(entries in flight) and runs only when the
// earliest such deadline has passed.
func (d *dispatch) expire(now int64) (late, held []*entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
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
	held, _ = d.q.interrupt(late, now)
	if len(held) > 0 && d.q.waits.n > 0 {
		// The held entries' room is the waiters' now. If the rules panic
		// in promote, the restart answers the late and held entries too:
		// they are claimed or out of the queue already.
		taken := append(slices.Clone(late), held...)
		defer d.rescue(&taken)
		dropped := d.q.promote(now)
		held = append(held, dropped...)
	}
	return late, held
}

// abandon removes every queued and waiting entry and claims every entry
// in a request, cancelling the requests, and returns them all, for an
// actor that answers everything it holds at once (restart, abort, stop).
// The requests keep their slots until their goroutines end. With pause
// (a restart: everything is answered ErrBatcherDown and retried), their
// groups pause as for any answer that leaves a message's fate to its
// caller (pause.go), and so do those of extra, deliveries being handled
// that were never admitted.
func (d *dispatch) abandon(now int64, pause bool, extra ...*entry) []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	var all []*entry
	for f := range d.running {
		for i, e := range f.entries {
			if f.claims[i].CompareAndSwap(false, true) {
				all = append(all, e)
			}
		}
		f.cancel()
	}
	all = append(all, d.q.drainAll()...)
	all = append(all, d.q.drainWaiters()...)
	if pause {
		for _, e := range extra {
			if e.rank == 0 {
				e.rank = d.q.newRank()
			}
		}
		d.q.interrupt(append(slices.Clone(all), extra...), now)
	}
	return all
}

// markDown ends the incarnation's taking: see dispatch.
func (d *dispatch) markDown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
}

// pauses returns a copy of the paused groups, for the next incarnation.
func (d *dispatch) pauses() pauses {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.q.paused.clone()
}

// seedPauses hands the paused groups of a crashed incarnation to this one,
// before it admits anything, with the last rank it gave: what this one
// admits ranks after what the pauses wait for.
func (d *dispatch) seedPauses(p pauses, rank uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.q.paused = p
	d.q.rank = rank
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
	next.seedPauses(d.q.paused.clone(), d.q.rank)
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
