package batcher

import (
	"math"

	"github.com/ankusa/sinkbatch/messages"
)

// This file holds the rules of Tuning.WhenFull Block. A delivery that does
// not fit the queue's bounds waits in the waiting list instead of being
// refused; at most QueueMax deliveries wait, past that a delivery is
// refused as with Refuse, so memory stays bounded. A delivery also waits,
// though it fits, while anything waits: it must not take the room the
// waiters wait for. Whenever room frees (a batch is taken, a sweep removes
// abandoned entries, a caller leaves), promote admits waiters: round-robin
// across tenants, in arrival order within a tenant, and an entry of a group
// only once it is the group's oldest waiter, so a group's entries never
// overtake each other across tenants. The waiter whose turn it is keeps its
// turn until the queue has room for it: the room that frees meanwhile is
// reserved for it, not taken by a smaller message behind it (Google's
// publisher flow control is strictly first come, first served for the same
// reason); only a waiter held by its own tenant's bound passes its turn on.
// A waiter whose deadline passes is answered with an error wrapping
// context.DeadlineExceeded and was never queued.

// waitlist is the deliveries waiting for room. Removal is lazy: a removed
// waiter is marked waitGone and skipped.
type waitlist struct {
	n           int // live waiters
	tenants     map[string]*waitTenant
	order       []*waitTenant // tenants with waiters, in turn order
	turn        int           // index in order of the tenant whose turn is next
	groups      map[string]*waitFIFO
	minDeadline int64 // no live waiter has an earlier deadline; MaxInt64 when none
}

// waitFIFO is a FIFO of waiters; dead ones are skipped.
type waitFIFO struct {
	entries []*entry
	head    int
	live    int
}

// waitTenant is one tenant's waiters, in arrival order.
type waitTenant struct {
	name string
	waitFIFO
}

func newWaitlist() waitlist {
	return waitlist{minDeadline: math.MaxInt64}
}

// holds says whether e must wait, though it fits: while anything waits, the
// room that frees is the waiters' in their turn (promote), and a newcomer
// waits for its own turn. It also says with which reason e is refused if the
// waiting list is full.
func (w *waitlist) holds(e *entry) (messages.FullReason, bool) {
	if w.n == 0 {
		return 0, false
	}
	if w.tenants[e.msg.Tenant] != nil {
		return messages.FullTenant, true
	}
	return messages.FullEntries, true
}

// wait adds e to the waiting list, unless QueueMax deliveries already wait.
func (q *queue) wait(e *entry) bool {
	w := &q.waits
	if w.n >= q.s.queueMax {
		return false
	}
	if w.tenants == nil {
		w.tenants = make(map[string]*waitTenant)
		w.groups = make(map[string]*waitFIFO)
	}
	t := w.tenants[e.msg.Tenant]
	if t == nil {
		t = &waitTenant{name: e.msg.Tenant}
		w.tenants[t.name] = t
		w.order = append(w.order, t)
	}
	t.push(e)
	if g := e.msg.Group; g != "" {
		f := w.groups[g]
		if f == nil {
			f = &waitFIFO{}
			w.groups[g] = f
		}
		f.push(e)
	}
	e.waited = true
	w.n++
	w.minDeadline = min(w.minDeadline, e.deadline)
	return true
}

// evictFor makes room in a full waiting list for e, fairly: it removes and
// returns the newest waiter of the tenant with the most waiters, if that
// tenant has more than e's tenant would have with e, so that a tenant that
// floods cannot keep the others from waiting. It removes nothing that a
// later waiter of its group stands behind (that waiter would overtake it),
// and returns nil when it removes nothing. The removed waiter was never
// queued: it is answered as a refusal.
func (q *queue) evictFor(e *entry) *entry {
	w := &q.waits
	var fat *waitTenant
	for _, t := range w.order {
		if fat == nil || t.live > fat.live {
			fat = t
		}
	}
	mine := 1
	if t := w.tenants[e.msg.Tenant]; t != nil {
		mine += t.live
	}
	if fat == nil || fat.live <= mine {
		return nil
	}
	var last *entry
	for i := len(fat.entries) - 1; i >= fat.head; i-- {
		if x := fat.entries[i]; !x.waitGone {
			last = x
			break
		}
	}
	if g := last.msg.Group; g != "" {
		f := w.groups[g]
		if f.entries[len(f.entries)-1] != last {
			return nil
		}
	}
	w.remove(last)
	return last
}

// promote admits waiters while they fit, round-robin across tenants, and
// returns those it found abandoned (deadline passed, caller gone), to be
// answered. It stops when a whole turn admits nothing.
func (q *queue) promote(now int64) (dropped []*entry) {
	// The removed waiters gather in the builder, as a take's do: if the
	// rules panic midway, drainAll still finds them.
	b := q.build(now)
	w := &q.waits
	for misses := 0; w.n > 0 && misses < len(w.order); {
		if w.turn >= len(w.order) {
			w.turn = 0
		}
		t := w.order[w.turn]
		e := t.first()
		if e.deadline <= now || e.gone() {
			w.remove(e)
			b.dropped = append(b.dropped, e)
			// Its group's later waiters wait for its retry (pause.go).
			held, _ := q.interrupt([]*entry{e}, now)
			b.dropped = append(b.dropped, held...)
			continue
		}
		if g := e.msg.Group; g != "" && w.groups[g].first() != e {
			// An older waiter of its group, of another tenant, goes first.
			w.turn++
			misses++
			continue
		}
		reason, ok := q.fits(e)
		if !ok && reason != messages.FullTenant {
			// The waiter whose turn it is keeps it: the room that frees
			// next is reserved for it, not taken by a smaller waiter
			// behind it (it would starve beside small messages).
			break
		}
		if !ok {
			// Its tenant's own bound: the room it waits for is not the
			// others'.
			w.turn++
			misses++
			continue
		}
		w.remove(e)
		q.insert(e, now)
		misses = 0
		// The turn passes on; remove may have dropped t from order.
		if w.turn < len(w.order) && w.order[w.turn] == t {
			w.turn++
		}
	}
	if w.n == 0 {
		w.minDeadline = math.MaxInt64
	}
	_, dropped = q.built()
	return dropped
}

// sweepWaiters removes every waiter whose deadline has passed or whose
// caller is gone and returns them. It costs O(waiters).
func (q *queue) sweepWaiters(now int64) (dropped []*entry) {
	b := q.build(now) // as in promote
	w := &q.waits
	next := int64(math.MaxInt64)
	for _, t := range append([]*waitTenant(nil), w.order...) {
		for _, e := range t.entries[t.head:] {
			// A removal at the head advances the head past removed
			// waiters and clears their slots: skip those too.
			if e == nil || e.waitGone {
				continue
			}
			if e.deadline <= now || e.gone() {
				w.remove(e)
				b.dropped = append(b.dropped, e)
				continue
			}
			next = min(next, e.deadline)
		}
	}
	w.minDeadline = next
	// The dropped waiters' groups hold back their later waiters (pause.go).
	held, _ := q.interrupt(b.dropped, now)
	b.dropped = append(b.dropped, held...)
	_, dropped = q.built()
	return dropped
}

// drainWaiters removes every waiter and returns them, in arrival order per
// tenant.
func (q *queue) drainWaiters() []*entry {
	w := &q.waits
	var all []*entry
	for _, t := range append([]*waitTenant(nil), w.order...) {
		for _, e := range t.entries[t.head:] {
			if !e.waitGone {
				all = append(all, e)
			}
		}
	}
	for _, e := range all {
		w.remove(e)
	}
	w.minDeadline = math.MaxInt64
	return all
}

// group returns g's live waiters, oldest first.
func (w *waitlist) group(g string) []*entry {
	f := w.groups[g]
	if f == nil {
		return nil
	}
	var out []*entry
	for _, e := range f.entries[f.head:] {
		if !e.waitGone {
			out = append(out, e)
		}
	}
	return out
}

// remove takes a live waiter out, deleting its tenant's and group's FIFOs
// when they empty.
func (w *waitlist) remove(e *entry) {
	e.waitGone = true
	w.n--
	t := w.tenants[e.msg.Tenant]
	t.live--
	t.skipDead()
	if t.live == 0 {
		delete(w.tenants, t.name)
		i := indexOf(w.order, t)
		w.order = append(w.order[:i], w.order[i+1:]...)
		if w.turn > i {
			w.turn--
		}
	}
	if g := e.msg.Group; g != "" {
		f := w.groups[g]
		f.live--
		f.skipDead()
		if f.live == 0 {
			delete(w.groups, g)
		}
	}
}

func indexOf(ts []*waitTenant, t *waitTenant) int {
	for i, x := range ts {
		if x == t {
			return i
		}
	}
	return -1
}

// push appends e, compacting the FIFO when removed entries outnumber live
// ones so that it does not grow without bound.
func (f *waitFIFO) push(e *entry) {
	if n := len(f.entries) - f.head; n > 16 && n > 2*f.live {
		f.entries, f.head = compact(f.entries, f.head, func(x *entry) bool { return x.waitGone }), 0
	}
	f.entries = append(f.entries, e)
	f.live++
}

// first is the oldest live waiter; the FIFO must have one.
func (f *waitFIFO) first() *entry {
	f.skipDead()
	return f.entries[f.head]
}

// skipDead advances the head past removed waiters.
func (f *waitFIFO) skipDead() {
	for f.head < len(f.entries) && f.entries[f.head].waitGone {
		f.entries[f.head] = nil
		f.head++
	}
}
