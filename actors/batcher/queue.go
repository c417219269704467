package batcher

import (
	"math"
	"sync/atomic"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file holds the batching rules: admission bounds, tenant round-robin,
// group gating, the flush decision and the sweep of abandoned entries. The
// queue reads no clock, starts no goroutine, sends no message and takes no
// lock: time comes in as an argument (an internal/mono instant) and a
// caller's leaving as an event (entry.left, which the caller sets; the
// request goroutine reports the callers it finds gone before it sends, see
// dispatch.leave), so table tests drive it step by step. It calls no
// caller's code. Its one driver is
// dispatch, which holds the lock around every call.

// entry is one admitted delivery.
type entry struct {
	msg      *codec.Message // its Tenant and Group place the entry
	to       caller         // who is answered; the rules never look inside
	deadline int64          // on the batcher's clock: after it the entry is abandoned
	admitted int64          // when it was admitted (for the queue wait)
	tenant   *tenant
	lane     *lane
	// size is Codec.Size of the message: at most a request's MaxBytes. An
	// int32 beside dead keeps an entry in a smaller size class.
	size int32
	dead bool // removed from the queue while still in its lane's slice
	// waitGone: the entry has left the waiting list (block.go), admitted
	// or answered, while still in its FIFOs' slices.
	waitGone bool
	// waited: the entry has been in the waiting list, whose slices may
	// still hold it: its Room is never released (see Owner).
	waited bool
	// rank orders the entries of a group by first delivery (pause.go).
	rank uint64
	// left, if set, is its caller's word that it gave up (Room.Leave):
	// an atomic the caller sets, which the rules read and never write.
	// An entry with no Room has none until the driver finds its caller
	// gone; markLeft then points it at leftWord, under dispatch.mu.
	left *atomic.Bool
	// heldBy: the entry was taken out because its group paused; it is
	// answered GroupPausedError naming this key (pause.go).
	heldBy string
}

// gone reports whether e's caller said it gave up (see left).
func (e *entry) gone() bool { return e.left != nil && e.left.Load() }

// silent reports whether e's caller may leave without a word: it has no
// left flag to say so with, but a sender that may stop waiting (an actor's
// future).
func (e *entry) silent() bool { return e.left == nil && e.to.sender != nil }

// leftWord is the left flag of an entry whose caller has no Room to say it
// left with (an actor's future): the driver found it gone and sets it
// (dispatch.admitSwept).
var leftWord = func() *atomic.Bool {
	b := new(atomic.Bool)
	b.Store(true)
	return b
}()

// silent returns the queued and waiting entries whose callers may have
// left without a word (entry.silent): the driver asks about them outside
// its lock. It costs O(queue + waiters), and nothing on a destination that
// never admitted such an entry (only front-door callers, which have Rooms).
func (q *queue) silent() (buf []*entry) {
	if !q.silentSeen {
		return nil
	}
	add := func(es []*entry, from int, skip func(*entry) bool) {
		for _, e := range es[from:] {
			if e != nil && !skip(e) && e.silent() {
				buf = append(buf, e)
			}
		}
	}
	queued := func(e *entry) bool { return e.dead }
	for _, t := range q.tenants {
		add(t.plain.entries, t.plain.head, queued)
	}
	for _, l := range q.groups {
		add(l.entries, l.head, queued)
	}
	for _, t := range q.waits.order {
		add(t.entries, t.head, func(e *entry) bool { return e.waitGone })
	}
	return buf
}

// lane is a FIFO of entries that must leave in order: one group's entries
// (across tenants), or one tenant's ungrouped entries. A lane is in the ring
// of the tenant that owns its head entry while it has live entries and its
// group has no request in flight.
type lane struct {
	group   string
	grouped bool
	entries []*entry // entries[head:] are queued; dead ones are skipped
	head    int
	live    int   // entries not dead
	dead    int   // dead entries in entries[head:]
	bytes   int64 // sum of the live entries' sizes
	gated   bool  // the group has a request in flight
	inBatch bool  // the group is part of the batch being taken
	owner   *tenant
	next    *lane
	prev    *lane
}

// tenant is one fairness unit. It is in the queue's ring while it owns at
// least one sendable lane.
type tenant struct {
	name   string
	count  int  // live entries of this tenant, sendable or gated
	plain  lane // the tenant's ungrouped entries
	lanes  *lane
	next   *tenant
	prev   *tenant
	inRing bool
}

// settings are a destination's effective tuning, in the queue's units.
type settings struct {
	maxEntries    int
	maxBytes      int
	maxInflight   int
	linger        int64 // nanoseconds
	queueMax      int
	queueMaxBytes int64
	tenantMax     int
	oneGroup      bool // a batch holds one group's entries, or ungrouped ones only
	block         bool // WhenFull Block: a delivery that does not fit waits (block.go)
	strict        bool // StrictGroups: a retryable failure pauses its group (pause.go)
	pauseMax      int64
}

// queue is the batching rules of one destination. Not safe for concurrent
// use: dispatch calls it holding its lock.
type queue struct {
	s       settings
	tenants map[string]*tenant
	groups  map[string]*lane
	ring    *tenant // the tenant whose turn is next; nil when nothing is sendable
	ringLen int     // tenants in the ring

	queued      int   // live entries, sendable or gated
	queuedBytes int64 // their sizes
	ready       int   // live entries in lanes that may be sent now
	readyBytes  int64
	inflight    int // requests in flight

	lingerFrom  int64 // when the queue became non-empty or the last batch left
	lingerNow   int64 // how long a batch lingers now: Linger, or longer under load (linger.go)
	minDeadline int64 // no live entry has an earlier deadline; MaxInt64 when none
	draining    bool  // send whatever is sendable, without waiting for Linger
	// building is the batch a take is building (&builder), until it
	// returns: if the take panics (a fault in the rules), drainAll
	// still finds it.
	building *batchBuilder
	builder  batchBuilder
	// silentSeen: an entry whose caller has no left flag but a sender
	// (an actor's future) was admitted; until then silent finds nothing.
	silentSeen bool
	// kept holds entries removed from the queue whose answer a panic
	// interrupted (see keep): drainAll returns them.
	kept []*entry

	paused pauses   // StrictGroups: the paused groups (pause.go)
	rank   uint64   // the rank given last (pause.go)
	waits  waitlist // WhenFull Block: deliveries waiting for room
}

func newQueue(s settings) *queue {
	return &queue{
		s:           s,
		tenants:     make(map[string]*tenant),
		groups:      make(map[string]*lane),
		minDeadline: math.MaxInt64,
		lingerNow:   s.linger,
		paused:      pauses{minUntil: math.MaxInt64},
		waits:       newWaitlist(),
	}
}

// admit queues e at time now, or says which bound refuses it. A refused entry
// leaves the queue unchanged. The caller has checked that e.size fits in one
// request.
func (q *queue) admit(e *entry, now int64) (messages.FullReason, bool) {
	if reason, ok := q.fits(e); !ok {
		return reason, false
	}
	if reason, held := q.waits.holds(e); held {
		// A delivery must not overtake its tenant's or its group's
		// waiters (block.go).
		return reason, false
	}
	return 0, q.insert(e, now)
}

// fits says which bound, if any, e would break.
func (q *queue) fits(e *entry) (messages.FullReason, bool) {
	if q.queued >= q.s.queueMax {
		return messages.FullEntries, false
	}
	if q.queuedBytes+int64(e.size) > q.s.queueMaxBytes {
		return messages.FullBytes, false
	}
	if t := q.tenants[e.msg.Tenant]; t != nil && t.count >= q.s.tenantMax {
		return messages.FullTenant, false
	}
	return 0, true
}

// insert queues e, which fits, at time now.
func (q *queue) insert(e *entry, now int64) bool {
	name := e.msg.Tenant
	t := q.tenants[name]
	if t == nil {
		t = &tenant{name: name}
		t.plain.owner = nil
		q.tenants[name] = t
	}
	l := &t.plain
	if g := e.msg.Group; g != "" {
		l = q.groups[g]
		if l == nil {
			l = &lane{group: g, grouped: true}
			q.groups[g] = l
		}
	}
	if q.queued == 0 {
		q.lingerFrom = now
	}
	e.tenant, e.lane = t, l
	l.push(e)
	t.count++
	q.queued++
	q.queuedBytes += int64(e.size)
	q.minDeadline = min(q.minDeadline, e.deadline)
	if !l.gated {
		q.ready++
		q.readyBytes += int64(e.size)
		if l.live == 1 {
			q.link(l, t)
		}
	}
	return true
}

// due reports whether a batch should be taken now, and why.
func (q *queue) due(now int64) (telemetry.Trigger, bool) {
	if q.ready == 0 || q.inflight >= q.s.maxInflight {
		return 0, false
	}
	switch {
	case q.ready >= q.s.maxEntries:
		return telemetry.TriggerEntries, true
	case q.readyBytes >= int64(q.s.maxBytes):
		return telemetry.TriggerBytes, true
	case q.draining:
		return telemetry.TriggerDrain, true
	case now >= q.lingerEnd():
		return telemetry.TriggerLinger, true
	}
	return 0, false
}

// wake is the earliest time after now at which the queue needs attention
// without a new message: Linger running out, or the earliest deadline of a
// queued entry. 0: none.
func (q *queue) wake() int64 {
	w := int64(math.MaxInt64)
	if q.ready > 0 && q.inflight < q.s.maxInflight && !q.draining {
		w = q.lingerEnd()
	}
	if q.queued > 0 {
		w = min(w, q.minDeadline)
	}
	w = min(w, q.waits.minDeadline, q.paused.minUntil)
	if w == math.MaxInt64 {
		return 0
	}
	return w
}

// take removes the next batch: entries one at a time round-robin across
// tenants, at most MaxEntries and MaxBytes, each group's entries in order.
// Entries whose deadline has passed or whose caller is gone are
// removed on the way and returned in dropped. The groups in the batch are
// gated until complete is called with them. A non-empty batch counts as a
// request in flight.
func (q *queue) take(now int64) (batch []*entry, groups []*lane, dropped []*entry) {
	if q.s.oneGroup {
		return q.takeOneGroup(now)
	}
	b := q.build(now)
	// The batch's one allocation: it takes at most this many.
	b.batch = make([]*entry, 0, min(q.s.maxEntries, q.ready))
	for len(b.batch) < q.s.maxEntries && q.ring != nil {
		t := q.ring
		l := t.lanes
		if took, full := q.offer(b, l); full {
			break
		} else if !took {
			continue
		}
		if l.grouped && !l.inBatch {
			l.inBatch = true
			groups = append(groups, l)
		}
		// The turn passes to the next tenant, and within this tenant to its
		// next lane, before l is moved to whoever owns its new head.
		if l.owner == t {
			t.lanes = l.next
		}
		q.ring = t.next
		q.place(l)
	}
	for _, l := range groups {
		l.inBatch = false
		q.gate(l)
	}
	if len(b.batch) > 0 {
		q.inflight++
		q.lingerFrom = now
	}
	batch, dropped = q.built()
	return batch, groups, dropped
}

// batchBuilder is a batch being taken.
type batchBuilder struct {
	now     int64
	batch   []*entry
	dropped []*entry
	bytes   int
}

// build starts the batch a take builds.
func (q *queue) build(now int64) *batchBuilder {
	if b := q.building; b != nil {
		// A build a panic ended: what it had removed waits for drainAll.
		q.kept = append(append(q.kept, b.batch...), b.dropped...)
	}
	q.builder = batchBuilder{now: now}
	q.building = &q.builder
	return q.building
}

// built ends the take that build began and returns what it built.
func (q *queue) built() (batch, dropped []*entry) {
	batch, dropped = q.builder.batch, q.builder.dropped
	q.builder, q.building = batchBuilder{}, nil
	return batch, dropped
}

// keep puts entries that were removed from the queue but not answered yet
// where drainAll finds them: a panic is on its way, and the restart answers
// everything drainAll returns.
func (q *queue) keep(removed []*entry) {
	q.kept = append(q.kept, removed...)
}

// offer looks at l's head, which must be live: an abandoned head is removed
// into b.dropped; a head that would take the batch past MaxBytes is left
// where it is (full); any other is popped into the batch (took).
func (q *queue) offer(b *batchBuilder, l *lane) (took, full bool) {
	e := l.entries[l.head]
	if e.deadline <= b.now || e.gone() {
		q.drop(b, e)
		return false, false
	}
	if b.bytes+int(e.size) > q.s.maxBytes {
		return false, true
	}
	q.pop(l)
	l.skipDead()
	b.batch = append(b.batch, e)
	b.bytes += int(e.size)
	return true, false
}

// drop removes e, a queued entry whose deadline has passed or whose caller
// is gone, into b.dropped, with the entries its group holds back for it
// (pause.go): none of the group's later entries may leave before its retry.
func (q *queue) drop(b *batchBuilder, e *entry) {
	q.remove(e)
	b.dropped = append(b.dropped, e)
	if q.s.strict && e.msg.Group != "" {
		held, _ := q.interrupt([]*entry{e}, b.now)
		b.dropped = append(b.dropped, held...)
	}
}

// takeOneGroup is take for destinations whose requests hold one group: the
// tenant whose turn it is decides the batch's group by its next lane. A group
// lane fills the batch in its own order; ungrouped entries are taken
// round-robin across the tenants' ungrouped lanes, passing over tenants that
// have none ready (at most one lap without taking anything).
func (q *queue) takeOneGroup(now int64) (batch []*entry, groups []*lane, dropped []*entry) {
	b := q.build(now)
	for q.ring != nil { // drop abandoned heads until one decides the group
		l := q.ring.lanes
		e := l.entries[l.head]
		if e.deadline > now && !e.gone() {
			break
		}
		q.drop(b, e)
	}
	if q.ring == nil {
		_, dropped = q.built()
		return nil, nil, dropped
	}
	t := q.ring
	if l := t.lanes; l.grouped {
		b.batch = make([]*entry, 0, min(q.s.maxEntries, l.live))
		l.inBatch = true
		for len(b.batch) < q.s.maxEntries && l.live > 0 {
			if _, full := q.offer(b, l); full {
				break
			}
		}
		// The turn passes on, to t's next lane and the next tenant.
		if l.owner == t {
			t.lanes = l.next
		}
		if t.inRing {
			q.ring = t.next
		}
		l.inBatch = false
		if len(b.batch) == 0 { // every entry was abandoned: nothing to gate
			q.place(l)
		} else {
			q.gate(l)
			groups = []*lane{l}
		}
	} else {
		b.batch = make([]*entry, 0, min(q.s.maxEntries, q.ready))
		for misses := 0; len(b.batch) < q.s.maxEntries && q.ring != nil && misses < q.ringLen; {
			t := q.ring
			p := &t.plain
			if p.owner != t {
				q.ring = t.next
				misses++
				continue
			}
			if took, full := q.offer(b, p); full {
				break
			} else if !took {
				continue
			}
			misses = 0
			if t.lanes == p {
				t.lanes = p.next
			}
			q.ring = t.next
			q.place(p)
		}
		if len(b.batch) > 0 {
			q.lingerFrom = now
		}
	}
	// A group batch does not restart the linger clock: the group's later
	// entries gather behind its gate while its request is in flight, and the
	// other groups' entries, which cannot join this request, have lingered
	// already.
	if len(b.batch) > 0 {
		q.inflight++
	}
	batch, dropped = q.built()
	return batch, groups, dropped
}

// complete ends a request taken by take: its groups may send again.
func (q *queue) complete(groups []*lane) {
	q.inflight--
	for _, l := range groups {
		l.gated = false
		q.ready += l.live
		q.readyBytes += l.bytes
		q.place(l)
	}
}

// sweep removes every entry whose deadline has passed or whose caller is
// gone, and returns them. It costs O(queue); the driver calls it when room is
// needed or a deadline has passed, not per delivery.
func (q *queue) sweep(now int64) (dropped []*entry) {
	// The removed entries gather in the builder, as a take's do: if the
	// rules panic midway, drainAll still finds them.
	b := q.build(now)
	minDeadline := int64(math.MaxInt64)
	visit := func(l *lane) {
		for i := l.head; i < len(l.entries); i++ {
			// A removal at the head advances the head past dead entries
			// and clears their slots: skip those too.
			e := l.entries[i]
			if e == nil || e.dead {
				continue
			}
			if e.deadline <= now || e.gone() {
				b.dropped = append(b.dropped, e)
				q.remove(e)
				continue
			}
			minDeadline = min(minDeadline, e.deadline)
		}
	}
	for _, t := range q.tenants {
		visit(&t.plain)
	}
	for _, l := range q.groups {
		visit(l)
	}
	q.minDeadline = minDeadline
	// The dropped entries' groups hold back their later entries (pause.go).
	held, _ := q.interrupt(b.dropped, now)
	b.dropped = append(b.dropped, held...)
	_, dropped = q.built()
	return dropped
}

// drainAll removes and returns every queued entry, for a batcher that answers
// them all at once (restart, abort). Requests in flight stay counted.
func (q *queue) drainAll() []*entry {
	var all []*entry
	for _, t := range q.tenants {
		all = t.plain.appendLive(all)
	}
	for _, l := range q.groups {
		all = l.appendLive(all)
	}
	for _, e := range all {
		q.remove(e)
	}
	if b := q.building; b != nil {
		// A take panicked: the entries it had taken out are in no lane.
		all = append(append(all, b.batch...), b.dropped...)
		q.building = nil
	}
	all = append(all, q.kept...)
	q.kept = nil
	return all
}

// pop removes l's head entry, which the caller has checked is live.
func (q *queue) pop(l *lane) *entry {
	e := l.entries[l.head]
	l.entries[l.head] = nil
	l.head++
	q.forget(e)
	return e
}

// remove takes a live entry out of the queue wherever it stands in its lane.
func (q *queue) remove(e *entry) {
	e.dead = true
	e.lane.dead++
	q.forget(e)
	q.place(e.lane)
}

// forget updates the counts for a live entry leaving the queue.
func (q *queue) forget(e *entry) {
	l, t := e.lane, e.tenant
	size := int64(e.size)
	l.live--
	l.bytes -= size
	if !l.gated {
		q.ready--
		q.readyBytes -= size
	}
	q.queued--
	q.queuedBytes -= size
	t.count--
	if t.count == 0 {
		delete(q.tenants, t.name)
	}
}

// gate marks l's group as having a request in flight: its entries wait.
func (q *queue) gate(l *lane) {
	l.gated = true
	q.ready -= l.live
	q.readyBytes -= l.bytes
	q.place(l)
}

// place puts l where it belongs after a change: in the ring of the tenant
// owning its head when it has live entries and is not gated, nowhere
// otherwise; an empty, idle group lane is deleted.
func (q *queue) place(l *lane) {
	l.skipDead()
	var want *tenant
	if l.live > 0 && !l.gated {
		want = l.entries[l.head].tenant
	}
	if l.owner != want {
		if l.owner != nil {
			q.unlink(l)
		}
		if want != nil {
			q.link(l, want)
		}
	}
	if l.live == 0 {
		clear(l.entries[l.head:])
		l.entries, l.head, l.dead = l.entries[:0], 0, 0
		if l.grouped && !l.gated && !l.inBatch {
			delete(q.groups, l.group)
		}
	}
}

// link puts l last in t's turn, and t last in the queue's turn if it had no
// sendable lane.
func (q *queue) link(l *lane, t *tenant) {
	l.owner = t
	if t.lanes == nil {
		l.next, l.prev = l, l
		t.lanes = l
	} else {
		l.next, l.prev = t.lanes, t.lanes.prev
		l.prev.next, l.next.prev = l, l
	}
	if t.inRing {
		return
	}
	t.inRing = true
	q.ringLen++
	if q.ring == nil {
		t.next, t.prev = t, t
		q.ring = t
		return
	}
	t.next, t.prev = q.ring, q.ring.prev
	t.prev.next, t.next.prev = t, t
}

// unlink takes l out of its owner's turn, and the owner out of the queue's
// turn when it has no sendable lane left.
func (q *queue) unlink(l *lane) {
	t := l.owner
	l.owner = nil
	if l.next == l {
		t.lanes = nil
	} else {
		l.prev.next, l.next.prev = l.next, l.prev
		if t.lanes == l {
			t.lanes = l.next
		}
	}
	l.next, l.prev = nil, nil
	if t.lanes != nil {
		return
	}
	t.inRing = false
	q.ringLen--
	if t.next == t {
		q.ring = nil
	} else {
		t.prev.next, t.next.prev = t.next, t.prev
		if q.ring == t {
			q.ring = t.next
		}
	}
	t.next, t.prev = nil, nil
}

// push appends e, compacting the lane when dead entries outnumber live ones
// so that a lane whose callers keep giving up does not grow without bound.
func (l *lane) push(e *entry) {
	if l.dead > 16 && l.dead > l.live {
		l.entries, l.head, l.dead = compact(l.entries, l.head, func(x *entry) bool { return x.dead }), 0, 0
	} else if l.head > 0 && l.head >= len(l.entries)/2 && len(l.entries) == cap(l.entries) {
		n := copy(l.entries, l.entries[l.head:])
		clear(l.entries[n:])
		l.entries, l.head = l.entries[:n], 0
	}
	l.entries = append(l.entries, e)
	l.live++
	l.bytes += int64(e.size)
}

// compact moves the entries of es[head:] that are not gone to the front of
// es, in order, clears the rest and returns them: the one compaction of the
// lazy-deletion FIFOs (lanes, and the waiting list's FIFOs).
func compact(es []*entry, head int, gone func(*entry) bool) []*entry {
	n := 0
	for _, x := range es[head:] {
		if !gone(x) {
			es[n] = x
			n++
		}
	}
	clear(es[n:])
	return es[:n]
}

// skipDead advances the head past dead entries, so that it is live
// whenever the lane has live entries.
func (l *lane) skipDead() {
	for l.head < len(l.entries) && l.entries[l.head].dead {
		l.entries[l.head] = nil
		l.head++
		l.dead--
	}
}

func (l *lane) appendLive(all []*entry) []*entry {
	for _, e := range l.entries[l.head:] {
		if !e.dead {
			all = append(all, e)
		}
	}
	return all
}
