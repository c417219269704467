package batcher

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/ankusa/sinkbatch/codec"
)

// FuzzStrictGroupOrder drives a dispatch with StrictGroups (and, by the
// first byte, WhenFull Block and one group per request) through deliveries,
// requests that succeed or fail per entry, expiries in the queue and in
// flight, refusals and restarts, with callers that behave as the actors
// package documents: each message a caller was answered without a final
// result (a retryable failure, GroupPausedError, a refusal, an expiry,
// ErrBatcherDown) it delivers again with the same key, oldest first. After
// every step it checks the promise: per group, the keys stored, in the order
// each first reached the destination, are in the order the group first
// delivered them; no group has two requests in flight; no caller is
// answered twice; the queue's counts hold; with Block, no waiter waits on
// its turn while the queue has room for it. (ResumeGroup and GroupPauseMax
// end a pause without the retries by design: they are not used here.)
//
// Each byte is an operation: kind in the low 3 bits, argument v in the
// high 5.
//
//	0  deliver  group v%2's next new message, of tenant v%3, deadline 1+v%8
//	            ticks on, size 1+(v/8)%4*30 bytes (the queue holds 150)
//	1  retry    group v%2's oldest message owed a retry (as deliver)
//	2  launch   the batch due now, if any
//	3  finish   request v (mod their number): each entry succeeds or fails
//	            retryably (and so do its group's later entries in the
//	            request, as Pub/Sub's and a bisection's do) by the bits of
//	            v; every fourth message of a group is refused for good,
//	            every time
//	4  tick     the clock moves 1+v%4 and expiries are swept
//	5  restart  the incarnation crashes: everything it holds is answered
//	            ErrBatcherDown; its requests run on and may still store
//	6           deliver, as 0
//	7  leave    the caller of the v-th (mod their number) unanswered
//	            delivery gives up, and will deliver it again: queued or
//	            waiting, it says so (Room.Leave) and the queue is swept, as
//	            CallerLeft makes the actor do; in a request whose goroutine
//	            has not yet asked its callers, that goroutine finds it gone
//	            (dispatch.leave) before it sends; in a request already sent,
//	            nothing changes
func FuzzStrictGroupOrder(f *testing.F) {
	for _, seed := range []string{
		"\x00\x00\x00\x08\x02\x02\x1b\x01\x02\x03",
		"\x01\x00\x08\x00\x08\x02\x24\x0c\x01\x02\x05\x01\x09\x02\x03\x02\x03",
		"\x02\x00\x00\x00\x00\x00\x02\x04\x04\x04\x02\x0b\x01\x01\x02\x03",
		"\x03\x00\x08\x10\x18\x02\x05\x01\x09\x02\x13\x02\x0b",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		sgRun(t, data)
	})
}

type sgMsg struct {
	group string
	index int // first-delivery order within the group
	key   string
}

type sgHarness struct {
	t        *testing.T
	s        settings
	d        *dispatch
	now      int64
	nextIdx  map[string]int
	owed     map[string]map[int]bool // group -> indexes owed a retry
	msgOf    map[*entry]sgMsg
	answered map[*entry]bool
	running  []*inflight        // of every incarnation
	asked    map[*inflight]bool // requests whose goroutine asked its callers
	order    []*entry           // every entry delivered, in order
	stored   map[string][]int   // group -> first appearance order of indexes
	seen     map[string]bool    // keys stored at least once
	old      []*dispatch        // crashed incarnations, whose requests may still run
	ops      []string
}

func sgRun(t *testing.T, data []byte) {
	s := settings{
		maxEntries: 3, maxBytes: 100, maxInflight: 2, linger: 0,
		queueMax: 4, queueMaxBytes: 150, tenantMax: 3,
		strict: true, pauseMax: math.MaxInt64 / 4,
		block: data[0]&1 == 1, oneGroup: data[0]&2 == 2,
	}
	h := &sgHarness{t: t, s: s, now: 1, nextIdx: map[string]int{}, owed: map[string]map[int]bool{},
		msgOf: map[*entry]sgMsg{}, answered: map[*entry]bool{}, stored: map[string][]int{}, seen: map[string]bool{},
		asked: map[*inflight]bool{}}
	h.d = handoffDispatch(s)
	for _, op := range data[1:] {
		kind, v := op&7, int(op>>3)
		g := []string{"g", "h"}[v%2]
		switch kind {
		case 1:
			if i, ok := h.oldestOwed(g); ok {
				h.deliver(sgMsg{group: g, index: i, key: fmt.Sprintf("%s%d", g, i)}, v)
			}
		case 2:
			h.launch()
		case 3:
			h.finish(v)
		case 4:
			h.now += int64(1 + v%4)
			h.logf("tick to %d", h.now)
			if v < 16 { // else the next delivery that needs room sweeps (admit)
				for _, e := range h.d.sweep(h.now) {
					h.answer(e, e.heldBy == "" && e.deadline > h.now && !e.gone(), "sweep")
				}
			}
			late, held := h.d.expire(h.now)
			for _, e := range append(late, held...) {
				h.answer(e, false, "expire")
			}
		case 5:
			h.restart()
		case 7:
			h.leave(v)
		default:
			i := h.nextIdx[g]
			h.nextIdx[g]++
			h.deliver(sgMsg{group: g, index: i, key: fmt.Sprintf("%s%d", g, i)}, v)
		}
		checkCounts(t, h.d.q)
		h.checkTurn()
	}
}

// checkTurn checks Block's turn: the waiter whose turn it is waits only
// while the queue has no room for it (or an older waiter of its group
// waits, or its tenant's own bound holds it): room that freed went to it.
func (h *sgHarness) checkTurn() {
	q := h.d.q
	w := &q.waits
	if w.n == 0 || h.d.down || h.d.inherited() {
		return
	}
	e := w.order[w.turn%len(w.order)].first()
	if g := e.msg.Group; g != "" && w.groups[g].first() != e {
		return
	}
	if _, ok := q.fits(e); ok {
		h.fatalf("%s waits on its turn though the queue has room for it", e.msg.IdempotencyKey)
	}
}

func (h *sgHarness) logf(format string, args ...any) {
	h.ops = append(h.ops, fmt.Sprintf(format, args...))
}

func (h *sgHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\nsteps:\n%v", fmt.Sprintf(format, args...), h.ops)
}

func (h *sgHarness) oldestOwed(g string) (int, bool) {
	best := -1
	for i := range h.owed[g] {
		if best < 0 || i < best {
			best = i
		}
	}
	return best, best >= 0
}

// answer records e's answer: final (stored or refused for good), or one
// that its caller retries.
func (h *sgHarness) answer(e *entry, final bool, why string) {
	h.t.Helper()
	m, ok := h.msgOf[e]
	if !ok {
		h.fatalf("%s: an entry nobody delivered", why)
	}
	if h.answered[e] {
		h.fatalf("%s: %s answered twice", why, m.key)
	}
	h.answered[e] = true
	h.logf("%s answers %s final=%v", why, m.key, final)
	if !final {
		if h.owed[m.group] == nil {
			h.owed[m.group] = map[int]bool{}
		}
		h.owed[m.group][m.index] = true
	}
}

// leave is op 7.
func (h *sgHarness) leave(v int) {
	var live []*entry
	for _, e := range h.order {
		if !h.answered[e] {
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		return
	}
	e := live[v%len(live)]
	h.logf("caller of %s leaves", e.msg.IdempotencyKey)
	for _, f := range h.running {
		i := slices.Index(f.entries, e)
		if i < 0 {
			continue
		}
		if h.asked[f] {
			return // sent: its answer comes with the request's
		}
		h.asked[f] = true
		gone := make([]bool, len(f.entries))
		gone[i] = true
		dropped, panicked := h.owner(f).leave(f, gone, h.now)
		if panicked != nil {
			h.t.Fatalf("leave panicked: %v", panicked)
		}
		for _, x := range dropped {
			h.answer(x, false, "left before its request")
		}
		return
	}
	e.left.Store(true)
	for _, x := range h.d.sweep(h.now) {
		h.answer(x, false, "left")
	}
}

func (h *sgHarness) deliver(m sgMsg, v int) {
	e := keyed(fmt.Sprint("t", v%3), m.group, m.index, m.key)
	e.left = new(atomic.Bool)
	h.order = append(h.order, e)
	e.deadline = h.now + 1 + int64(v%8)
	e.size = int32(1 + (v/8)%4*30) // 1 to 91 of a queue's 150 bytes
	h.msgOf[e] = m
	delete(h.owed[m.group], m.index)
	a := h.d.admit(e, h.now, false)
	h.logf("deliver %s -> ok=%v waiting=%v paused=%v(%s) down=%v", m.key, a.ok, a.waiting, a.paused, a.waitFor, a.down)
	for _, x := range a.dropped {
		h.answer(x, x.heldBy == "" && x.deadline > h.now && !x.gone(), "admit")
	}
	if a.evicted != nil {
		h.answer(a.evicted, false, "evicted")
	}
	if !a.ok && !a.waiting {
		h.answer(e, false, "refused")
	}
}

func (h *sgHarness) launch() {
	f, dropped := launchAt(h.d, h.now)
	for _, x := range dropped {
		h.answer(x, x.heldBy == "" && x.deadline > h.now && !x.gone(), "launch")
	}
	if f != nil {
		h.started(f)
	}
}

func (h *sgHarness) started(f *inflight) {
	inFlight := map[string]bool{}
	for _, r := range h.running {
		for _, e := range r.entries {
			inFlight[e.msg.Group] = true
		}
	}
	for _, e := range f.entries {
		if inFlight[e.msg.Group] {
			h.fatalf("group %s has two requests in flight", e.msg.Group)
		}
	}
	var keys []string
	for _, e := range f.entries {
		keys = append(keys, e.msg.IdempotencyKey)
	}
	h.logf("send %v", keys)
	h.running = append(h.running, f)
}

func (h *sgHarness) finish(v int) {
	if len(h.running) == 0 {
		return
	}
	j := v % len(h.running)
	f := h.running[j]
	h.running = append(h.running[:j], h.running[j+1:]...)
	res := make([]codec.Result, len(f.entries))
	failedGroup := map[string]bool{}
	for i, e := range f.entries {
		bit := (v >> (i % 4)) & 3
		switch {
		case h.msgOf[e].index%4 == 3:
			// The destination refuses this message for good, every time
			// (a retry of it is refused too).
			res[i].Err = &codec.EntryError{Code: "Invalid", Permanent: true}
		case failedGroup[e.msg.Group] || bit == 1:
			res[i].Err = &codec.EntryError{Code: "InternalError"}
			failedGroup[e.msg.Group] = true
		}
	}
	for i, e := range f.entries {
		if res[i].Err == nil {
			m := h.msgOf[e]
			if !h.seen[m.key] {
				h.seen[m.key] = true
				h.stored[m.group] = append(h.stored[m.group], m.index)
				st := h.stored[m.group]
				if n := len(st); n > 1 && st[n-2] > st[n-1] {
					h.fatalf("group %s stored %s%d after %s%d: first appearances %v", m.group, m.group, st[n-1], m.group, st[n-2], st)
				}
			}
		}
	}
	d := h.owner(f)
	r := d.finishWith(f, h.now, outcome{results: res})
	h.logf("finish %d", j)
	for i, e := range f.entries {
		if r.won[i] {
			h.answer(e, res[i].Err == nil || codec.IsPermanent(res[i].Err), "result")
		}
	}
	for _, x := range r.held {
		h.answer(x, false, "held")
	}
	for _, x := range r.dropped {
		h.answer(x, x.heldBy == "" && x.deadline > h.now && !x.gone(), "finish's take")
	}
	if r.next != nil {
		h.started(r.next)
	}
}

// owner is the dispatch whose request f is.
func (h *sgHarness) owner(f *inflight) *dispatch {
	if _, ok := h.d.running[f]; ok {
		return h.d
	}
	for _, d := range h.old {
		if _, ok := d.running[f]; ok {
			return d
		}
	}
	return h.d
}

func (h *sgHarness) restart() {
	old := h.d
	old.markDown()
	for _, e := range old.abandon(h.now, true) {
		h.answer(e, false, "restart")
	}
	next := newDispatch(newQueue(h.s), old.goroutines)
	old.handPausesTo(next, func() {})
	h.old = append(h.old, old)
	h.d = next
	h.logf("restart")
}
