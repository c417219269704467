package batcher

import (
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// FuzzQueue runs a sequence of operations decoded from the input against
// queue and against refModel, and fails at the first step where they
// disagree or where queue's answer breaks a rule that holds whatever the
// turn order (fqHarness.checkTake).
//
// Input: 7 bytes of settings (see fqDecodeSettings; the third, 128 and
// above, also sets oneGroup), then operations. An
// operation is one byte, kind in the low 3 bits and its argument v in the
// high 5, and for admit one more byte:
//
//	0-2  admit    tenant v%4, group v/4%4 ("", "", "g", "h"); then a byte:
//	              size low%16 (mod MaxBytes+1), deadline high<12: now+1+high, else none
//	3-4  take     alive(v); with MaxInflight requests in flight, the oldest
//	              completes first, as the driver takes only when due
//	5    complete in-flight request v (mod their number)
//	6    sweep    alive(v)
//	7    v<24: advance the clock by 1+v%8; 24-29: toggle draining; 30-31: drainAll
//
// alive(v): v<16 everyone; else not the entries whose id%8 is v%8, nor, for
// v>=24, (v+4)%8. The queue hears it as each entry's left flag, set before
// the operation (Room.Leave), the model as a predicate.
//
// The encoding is dense because Go's minimizer is quadratic in the input's
// length: long inputs stall the fuzzer for its whole -fuzzminimizetime. A
// missing byte reads as 0. At the end every request is completed and the
// queue drained, after which no tenant or group may be left in its maps.
func FuzzQueue(f *testing.F) {
	for _, seed := range fqSeeds() {
		f.Add(seed)
	}
	f.Fuzz(fqRun)
}

const fqMaxOps = 120

var (
	fqTenants = [4]string{"a", "b", "c", "d"}
	fqGroups  = [4]string{"", "", "g", "h"} // ungrouped twice as often
)

func fqDecodeSettings(r *fqReader) settings {
	return settings{
		maxEntries:    1 + int(r.next()%6),
		maxBytes:      1 + int(r.next()%16),
		maxInflight:   1 + int(r.peek()%3),
		oneGroup:      r.next() >= 128,
		linger:        1 + int64(r.next()%8),
		queueMax:      1 + int(r.next()%16),
		queueMaxBytes: 1 + int64(r.next()%64),
		tenantMax:     1 + int(r.next()%8),
	}
}

// fqAliveMask is which id classes (id%8) of entries still have a caller.
func fqAliveMask(v byte) uint8 {
	if v < 16 {
		return 0xff
	}
	mask := ^uint8(1 << (v % 8))
	if v >= 24 {
		mask &^= 1 << ((v + 4) % 8)
	}
	return mask
}

func fqRun(t *testing.T, data []byte) {
	r := &fqReader{b: data}
	h := newFQHarness(t, fqDecodeSettings(r))
	for n := 0; !r.done() && n < fqMaxOps; n++ {
		b := r.next()
		switch kind, v := b&7, b>>3; {
		case kind <= 2:
			arg := r.next()
			size := int(arg&15) % (h.q.s.maxBytes + 1)
			deadline := int64(math.MaxInt64)
			if d := arg >> 4; d < 12 {
				deadline = h.now + 1 + int64(d)
			}
			h.admit(fqTenants[v%4], fqGroups[v/4%4], size, deadline)
		case kind <= 4:
			if h.q.inflight >= h.q.s.maxInflight {
				h.complete(0)
				h.check()
			}
			h.take(fqAliveMask(v))
		case kind == 5:
			if len(h.reqs) > 0 {
				h.complete(int(v) % len(h.reqs))
			}
		case kind == 6:
			h.sweep(fqAliveMask(v))
		case v < 24:
			d := 1 + int64(v%8)
			h.now += d
			h.logf("advance %d -> now %d", d, h.now)
		case v < 30:
			h.q.draining = !h.q.draining
			h.m.draining = h.q.draining
			h.logf("draining = %v", h.q.draining)
		default:
			h.drainAll()
		}
		h.check()
	}
	for len(h.reqs) > 0 {
		h.complete(0)
		h.check()
	}
	h.drainAll()
	h.check()
	if os.Getenv("FQ_TRACE") != "" { // FQ_TRACE=1 go test -run FuzzQueue -v: the steps of each seed
		t.Log(fqTrail{h})
	}
	require.Empty(t, h.q.tenants, "tenants left after everything completed and drained\n%s", fqTrail{h})
	require.Empty(t, h.q.groups, "groups left after everything completed and drained\n%s", fqTrail{h})
	require.Nil(t, h.q.ring, "ring left after everything completed and drained\n%s", fqTrail{h})
}

// fqReader hands out the input a byte at a time, then zeros.
type fqReader struct {
	b []byte
	i int
}

func (r *fqReader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *fqReader) peek() byte {
	if r.i >= len(r.b) {
		return 0
	}
	return r.b[r.i]
}

func (r *fqReader) done() bool { return r.i >= len(r.b) }

// fqHarness drives a queue and its model side by side.
type fqHarness struct {
	t    *testing.T
	q    *queue
	m    *refModel
	now  int64
	ids  int
	twin map[*entry]*refEntry
	reqs []fqRequest // in flight, oldest first
	ops  []string    // what was done, for failure messages
}

// fqRequest is one batch in flight, as queue and model each returned it.
type fqRequest struct {
	q     []*lane
	m     []*refLane
	names []string
}

func newFQHarness(t *testing.T, s settings) *fqHarness {
	h := &fqHarness{t: t, q: newQueue(s), m: newRefModel(s), now: 100, twin: map[*entry]*refEntry{}}
	h.logf("settings %+v", s)
	return h
}

func (h *fqHarness) logf(format string, args ...any) {
	h.ops = append(h.ops, fmt.Sprintf(format, args...))
}

// fqTrail prints the steps so far only when a failure message is built.
type fqTrail struct{ h *fqHarness }

func (tr fqTrail) String() string { return tr.h.trail() }

func (h *fqHarness) trail() string {
	var b strings.Builder
	b.WriteString("steps:\n")
	for i, op := range h.ops {
		fmt.Fprintf(&b, "%4d  %s\n", i, op)
	}
	return b.String()
}

// same fails with testify's diff when want and got differ. It checks with
// reflect.DeepEqual first: require.Equal's t.Helper costs more than the
// whole step.
func (h *fqHarness) same(want, got any, what string) {
	if !reflect.DeepEqual(want, got) {
		require.Equal(h.t, want, got, "%s\n%s", what, fqTrail{h})
	}
}

// sameSet is same for names in any order.
func (h *fqHarness) sameSet(want, got []string, what string) {
	if !slices.Equal(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(got))) {
		require.ElementsMatch(h.t, want, got, "%s\n%s", what, fqTrail{h})
	}
}

// fatalf stops the run with the steps so far.
func (h *fqHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), fqTrail{h})
}

// setAlive sets each queued entry's left flag (Room.Leave) from mask, for
// the queue, and returns the same word for the model.
func (h *fqHarness) setAlive(mask uint8) func(*refEntry) bool {
	m := func(e *refEntry) bool { return mask>>(e.id%8)&1 == 1 }
	for e, re := range h.twin {
		e.left.Store(!m(re))
	}
	return m
}

func (h *fqHarness) admit(tenant, group string, size int, deadline int64) {
	h.ids++
	name := fmt.Sprintf("%s/%s/%d", tenant, group, h.ids)
	e := withMsg(&entry{
		to:       caller{deliver: &messages.Deliver{Message: codec.Message{Tenant: tenant, Group: group}, Ref: name}},
		size:     int32(size),
		deadline: deadline,
		left:     new(atomic.Bool),
	})
	re := &refEntry{id: h.ids, name: name, tenant: tenant, group: group, size: size, deadline: deadline}
	h.twin[e] = re
	dl := "none"
	if deadline != math.MaxInt64 {
		dl = fmt.Sprint(deadline)
	}
	gotReason, gotOK := h.q.admit(e, h.now)
	wantReason, wantOK := h.m.admit(re, h.now)
	h.logf("admit %s size %d deadline %s at %d -> ok=%v %v", name, size, dl, h.now, gotOK, fqReason(gotReason, gotOK))
	if gotOK != wantOK || (!gotOK && gotReason != wantReason) {
		h.fatalf("admit %s: queue says %s, model says %s", name, fqReason(gotReason, gotOK), fqReason(wantReason, wantOK))
	}
}

func fqReason(r messages.FullReason, ok bool) string {
	if ok {
		return "admitted"
	}
	return "refused: " + r.String()
}

func (h *fqHarness) take(mask uint8) {
	mAlive := h.setAlive(mask)
	pre := h.snapshot()
	qBatch, qGroups, qDropped := h.q.take(h.now)
	mBatch, mGroups, mDropped := h.m.take(h.now, mAlive)
	batch, dropped := h.refs(qBatch), h.refs(qDropped)
	h.logf("take at %d alive %08b -> %v dropped %v", h.now, mask, refNames(batch), refNames(dropped))

	h.same(refNames(mBatch), refNames(batch), "take: the batch (model, queue)")
	h.sameSet(refNames(mDropped), refNames(dropped), "take: the dropped entries (model, queue)")
	gotGroups := []string{}
	for _, l := range qGroups {
		gotGroups = append(gotGroups, "g:"+l.group)
	}
	wantGroups := []string{}
	for _, l := range mGroups {
		wantGroups = append(wantGroups, l.key)
	}
	h.same(wantGroups, gotGroups, "take: the groups gated (model, queue)")
	h.checkTake(pre, batch, dropped, mAlive)
	if len(qBatch) > 0 {
		h.reqs = append(h.reqs, fqRequest{q: qGroups, m: mGroups, names: refNames(batch)})
	}
}

func (h *fqHarness) complete(i int) {
	req := h.reqs[i]
	h.reqs = slices.Delete(h.reqs, i, i+1)
	h.logf("complete %v", req.names)
	h.q.complete(req.q)
	h.m.complete(req.m)
}

func (h *fqHarness) sweep(mask uint8) {
	mAlive := h.setAlive(mask)
	dropped := h.refs(h.q.sweep(h.now))
	want := h.m.sweep(h.now, mAlive)
	h.logf("sweep at %d alive %08b -> dropped %v", h.now, mask, refNames(dropped))
	h.sameSet(refNames(want), refNames(dropped), "sweep: the dropped entries (model, queue)")
	if err := h.m.adoptOrder(h.queueTurns()); err != nil {
		h.fatalf("sweep: %v", err)
	}
	least := int64(math.MaxInt64)
	for _, e := range h.liveEntries() {
		least = min(least, e.deadline)
	}
	h.same(least, h.q.minDeadline, "sweep: minDeadline is the earliest deadline left")
}

func (h *fqHarness) drainAll() {
	all := h.refs(h.q.drainAll())
	want := h.m.drainAll()
	h.logf("drainAll -> %v", refNames(all))
	h.sameSet(refNames(want), refNames(all), "drainAll: the entries (model, queue)")
}

func (h *fqHarness) refs(es []*entry) []*refEntry {
	out := make([]*refEntry, len(es))
	for i, e := range es {
		out[i] = h.twin[e]
		if out[i] == nil {
			h.fatalf("queue returned an entry it was never given: %+v", e)
		}
	}
	return out
}

func (h *fqHarness) liveEntries() []*refEntry {
	var out []*refEntry
	for _, l := range h.m.lanes {
		out = append(out, l.entries...)
	}
	return out
}

// fqLaneView is one lane as a failure message shows it.
type fqLaneView struct {
	Entries []string
	Gated   bool
}

// check compares everything observable after a step, and queue's internal
// bookkeeping with what it should be.
func (h *fqHarness) check() {
	q, m := h.q, h.m
	tot, perTenant := m.totals()
	got := refTotals{Queued: q.queued, QueuedBytes: q.queuedBytes, Ready: q.ready, ReadyBytes: q.readyBytes, Inflight: q.inflight}
	h.same(tot, got, "counts (model, queue)")

	gotTenants := map[string]int{}
	for name, tn := range q.tenants {
		gotTenants[name] = tn.count
		if tn.name != name {
			h.fatalf("q.tenants[%q] is tenant %q", name, tn.name)
		}
	}
	h.same(perTenant, gotTenants, "per-tenant counts; a tenant with none must not be kept (model, queue)")

	wantLanes := map[string]fqLaneView{}
	for key, l := range m.lanes {
		wantLanes[key] = fqLaneView{refNames(l.entries), l.gated}
	}
	h.same(wantLanes, h.queueLanes(), "lanes; an idle group must not be kept (model, queue)")
	h.same(m.turnOrder(), h.queueTurns(), "turn order (model, queue)")

	for _, e := range h.liveEntries() {
		if q.minDeadline > e.deadline {
			h.fatalf("minDeadline %d is after %s's deadline %d", q.minDeadline, e.name, e.deadline)
		}
	}
	wantTrig, wantDue := m.due(h.now)
	gotTrig, gotDue := q.due(h.now)
	if wantDue != gotDue || (wantDue && wantTrig != gotTrig) {
		h.fatalf("due(%d): queue says %v %v, model says %v %v", h.now, gotDue, gotTrig, wantDue, wantTrig)
	}
	wantWake := int64(math.MaxInt64)
	if tot.Ready > 0 && m.inflight < q.s.maxInflight && !m.draining {
		wantWake = m.lingerFrom + q.s.linger
	}
	if tot.Queued > 0 {
		wantWake = min(wantWake, q.minDeadline)
	}
	if wantWake == math.MaxInt64 {
		wantWake = 0
	}
	h.same(wantWake, q.wake(), "wake (model, queue)")
}

// queueLanes reads every lane queue keeps, checking its bookkeeping.
func (h *fqHarness) queueLanes() map[string]fqLaneView {
	out := map[string]fqLaneView{}
	for name, tn := range h.q.tenants {
		if v := h.queueLane("t:"+name, &tn.plain); len(v.Entries) > 0 {
			out["t:"+name] = v
		}
		if tn.plain.gated || tn.plain.grouped {
			h.fatalf("tenant %s's ungrouped lane is gated or grouped", name)
		}
	}
	for g, l := range h.q.groups {
		if !l.grouped || l.group != g {
			h.fatalf("q.groups[%q] is lane %q (grouped %v)", g, l.group, l.grouped)
		}
		out["g:"+g] = h.queueLane("g:"+g, l)
	}
	return out
}

func (h *fqHarness) queueLane(key string, l *lane) fqLaneView {
	v := fqLaneView{Entries: []string{}, Gated: l.gated}
	live, dead := 0, 0
	var bytes int64
	for i, e := range l.entries[l.head:] {
		switch {
		case e == nil:
			h.fatalf("lane %s: entries[head+%d] is nil", key, i)
		case e.dead:
			dead++
		default:
			live++
			bytes += int64(e.size)
			v.Entries = append(v.Entries, h.twin[e].name)
			if e.lane != l || e.tenant != h.q.tenants[e.msg.Tenant] {
				h.fatalf("lane %s: %s points at another lane or a tenant not in q.tenants", key, h.twin[e].name)
			}
		}
	}
	if live != l.live || dead != l.dead || bytes != l.bytes {
		h.fatalf("lane %s: live %d dead %d bytes %d, counted %d %d %d", key, l.live, l.dead, l.bytes, live, dead, bytes)
	}
	if live > 0 && l.entries[l.head].dead {
		h.fatalf("lane %s: head is dead", key)
	}
	if l.inBatch {
		h.fatalf("lane %s: inBatch outside take", key)
	}
	return v
}

// queueTurns reads queue's ring and each tenant's lanes, next first,
// checking the links.
func (h *fqHarness) queueTurns() []refTurn {
	out := []refTurn{}
	q := h.q
	if q.ring == nil {
		return out
	}
	tn := q.ring
	for {
		if len(out) > len(fqTenants) {
			h.fatalf("the ring does not close")
		}
		if !tn.inRing || tn.next.prev != tn || q.tenants[tn.name] != tn {
			h.fatalf("ring: tenant %s is badly linked or not in q.tenants", tn.name)
		}
		tt := refTurn{Tenant: tn.name, Lanes: []string{}}
		l := tn.lanes
		for {
			if l == nil || len(tt.Lanes) > len(fqGroups)+1 {
				h.fatalf("ring: tenant %s's lanes are nil or do not close", tn.name)
			}
			key := "g:" + l.group
			if !l.grouped {
				key = "t:" + tn.name
				if l != &tn.plain {
					h.fatalf("ring: tenant %s holds another tenant's ungrouped lane", tn.name)
				}
			}
			if l.owner != tn || l.next.prev != l || l.gated || l.live == 0 || l.entries[l.head].tenant != tn {
				h.fatalf("ring: lane %s in %s's turns is badly linked, gated, empty or headed by another tenant", key, tn.name)
			}
			tt.Lanes = append(tt.Lanes, key)
			if l = l.next; l == tn.lanes {
				break
			}
		}
		out = append(out, tt)
		if tn = tn.next; tn == q.ring {
			break
		}
	}
	return out
}

// fqSnapLane is a lane as it stood before a take.
type fqSnapLane struct {
	entries []*refEntry
	gated   bool
}

func (h *fqHarness) snapshot() map[string]fqSnapLane {
	out := map[string]fqSnapLane{}
	for key, l := range h.m.lanes {
		out[key] = fqSnapLane{slices.Clone(l.entries), l.gated}
	}
	return out
}

// checkTake checks the rules a take must keep whatever the turn order:
// limits; only sendable entries, each lane's oldest first; drops only of
// abandoned entries; no stop while room and something sendable are left;
// and turns taken round-robin.
func (h *fqHarness) checkTake(pre map[string]fqSnapLane, batch, dropped []*refEntry, alive func(*refEntry) bool) {
	s, now := h.q.s, h.now
	if len(batch) > s.maxEntries {
		h.fatalf("take: %d entries, MaxEntries is %d", len(batch), s.maxEntries)
	}
	bytes := 0
	for _, e := range batch {
		bytes += e.size
	}
	if bytes > s.maxBytes {
		h.fatalf("take: %d bytes, MaxBytes is %d", bytes, s.maxBytes)
	}
	pos := map[*refEntry]int{}
	for i, e := range batch {
		pos[e] = i
		if s.oneGroup && e.group != batch[0].group {
			h.fatalf("take: one group per request, but %s and %s", batch[0].name, e.name)
		}
	}
	// The lanes a batch may take from, for the check that it stops only when
	// they have nothing it could take. With one group per request that is
	// the batch's group, or the tenants' ungrouped lanes; an empty batch's
	// lane is the model's to check.
	eligible := func(key string) bool {
		switch {
		case !s.oneGroup:
			return true
		case len(batch) == 0:
			return false
		case batch[0].group != "":
			return key == "g:"+batch[0].group
		}
		return strings.HasPrefix(key, "t:")
	}
	gone := map[*refEntry]bool{}
	for _, e := range dropped {
		gone[e] = true
	}
	for _, e := range slices.Concat(batch, dropped) {
		l, ok := pre[refLaneKey(e.tenant, e.group)]
		switch {
		case !ok || !slices.Contains(l.entries, e):
			h.fatalf("take: %s was not queued", e.name)
		case l.gated:
			h.fatalf("take: %s's group has a request in flight", e.name)
		case gone[e] && e.deadline > now && alive(e):
			h.fatalf("take: dropped %s, which is neither late nor abandoned", e.name)
		case !gone[e] && (e.deadline <= now || !alive(e)):
			h.fatalf("take: sent %s, which is late or abandoned", e.name)
		}
	}
	stuck, left := false, []string{}
	for _, key := range slices.Sorted(maps.Keys(pre)) {
		l := pre[key]
		if l.gated {
			continue
		}
		k := 0
		var sent *refEntry // the lane's last entry in the batch so far
		for ; k < len(l.entries) && (gone[l.entries[k]] || slices.Contains(batch, l.entries[k])); k++ {
			if e := l.entries[k]; !gone[e] {
				if sent != nil && pos[e] < pos[sent] {
					h.fatalf("take: lane %s: %s is sent before the older %s", key, e.name, sent.name)
				}
				sent = e
			}
		}
		for _, e := range l.entries[k:] {
			if gone[e] || slices.Contains(batch, e) {
				h.fatalf("take: lane %s: %s left while the older %s stayed", key, e.name, l.entries[k].name)
			}
		}
		if len(l.entries[k:]) > 0 && eligible(key) {
			head := l.entries[k]
			left = append(left, head.name)
			stuck = stuck || (head.deadline > now && alive(head) && bytes+head.size > s.maxBytes)
		}
	}
	if len(batch) < s.maxEntries && len(left) > 0 && !stuck {
		h.fatalf("take: stopped at %d entries, %d bytes with room left and %v at the head of their lanes", len(batch), bytes, left)
	}
	if len(dropped) == 0 && (!s.oneGroup || len(batch) > 0 && batch[0].group == "") {
		h.checkTurns(pre, batch)
	}
}

// checkTurns checks that tenants took turns round-robin. A lane belongs to
// the tenant of its oldest entry, so a tenant can run out of turns (its
// entries wait behind another tenant's in a group) and come back; the
// property that holds is that while a tenant owns a lane and waits for its
// turn, no other tenant gets two. A tenant's lanes change only on its own
// turn, so with nothing dropped, replaying the batch tells who owns what.
// With one group per request a batch of ungrouped entries goes round the
// tenants that have some, so only their ungrouped lanes count.
func (h *fqHarness) checkTurns(pre map[string]fqSnapLane, batch []*refEntry) {
	lanes := map[string][]*refEntry{}
	for key, l := range pre {
		if !l.gated && (!h.q.s.oneGroup || strings.HasPrefix(key, "t:")) {
			lanes[key] = l.entries
		}
	}
	waiting := map[string]map[string]int{} // tenant -> turns others took since it began waiting
	join := func() {
		for _, l := range lanes {
			if len(l) > 0 && waiting[l[0].tenant] == nil {
				waiting[l[0].tenant] = map[string]int{}
			}
		}
	}
	join()
	for i, e := range batch {
		y := e.tenant
		for x, seen := range waiting {
			if x == y {
				continue
			}
			if seen[y]++; seen[y] > 1 {
				h.fatalf("take: entry %d (%s) is tenant %s's second turn while tenant %s owned a lane and waited", i, e.name, y, x)
			}
		}
		key := refLaneKey(e.tenant, e.group)
		lanes[key] = lanes[key][1:]
		delete(waiting, y)
		join()
	}
}

// TestTurnsFollowLaneOwnership pins down what round-robin means when a
// group's entries belong to several tenants: a group's lane is in the turns
// of the tenant owning its oldest entry, so a tenant whose entries wait behind
// another's in a group has no turn until they reach the head. Counting
// entries per batch is therefore not a fairness measure: here a gets three
// and b one although b still has an entry at the end. What does hold, and
// FuzzQueue checks (checkTurns), is that no tenant gets two turns while
// another owns a lane and waits.
func TestTurnsFollowLaneOwnership(t *testing.T) {
	q := newQueue(settings{maxEntries: 4, maxBytes: 10, maxInflight: 1, linger: 1, queueMax: 10, queueMaxBytes: 100, tenantMax: 10})
	far := int64(math.MaxInt64)
	for _, e := range []*entry{
		fqEntry("a", "", 1, far), fqEntry("a", "", 2, far), fqEntry("a", "", 3, far),
		fqEntry("b", "g", 4, far), fqEntry("a", "g", 5, far), fqEntry("b", "g", 6, far),
	} {
		_, ok := q.admit(e, 0)
		require.True(t, ok)
	}
	batch, _, _ := q.take(0)
	// b/g/4 hands g to a, so b has no turn until a/g/5 hands it back.
	got := []any{}
	for _, e := range batch {
		got = append(got, e.to.deliver.Ref)
	}
	require.Equal(t, []any{"a//1", "b/g/4", "a//2", "a/g/5"}, got)
}

// TestSweepAfterMidLaneRemoval is the smallest input on which queue.sweep
// panics. Sweep removes b, abandoned behind the live head a, and leaves it in
// the lane marked dead. When a later sweep removes a, settle advances the
// lane's head past b and sets both slots to nil, but sweep's loop carries on
// from a's index and reads b's slot: a nil pointer dereference, which in the
// actor is a crash. The driver reaches it whenever a lane holds entries with
// different deadlines or a caller gives up (Cancels) behind a live head.
func TestSweepAfterMidLaneRemoval(t *testing.T) {
	q := newQueue(settings{maxEntries: 4, maxBytes: 10, maxInflight: 1, linger: 1, queueMax: 10, queueMaxBytes: 100, tenantMax: 10})
	a, b, c := fqEntry("a", "", 1, 10), fqEntry("a", "", 2, 5), fqEntry("a", "", 3, math.MaxInt64)
	for _, e := range []*entry{a, b, c} {
		_, ok := q.admit(e, 0)
		require.True(t, ok)
	}
	require.Len(t, q.sweep(6), 1, "b expires behind a")
	dropped := q.sweep(11)
	require.Len(t, dropped, 1, "a expires at the head")
	require.Equal(t, 1, q.queued)
}

// TestOneGroupTakeSkipsEntriesSweptBehindItsHead is the smallest input on
// which takeOneGroup mistakes a dead entry for a live one. A sweep removes
// g/2 behind the live head g/1 and leaves it in the lane marked dead. The
// grouped loop of takeOneGroup pops g/1 with pop, which does not advance past
// dead entries as settle does, so it reads g/2 as the next head: g/2 is
// removed (and returned as dropped) a second time, which subtracts it from
// every count again. The lane's live count reaches 0 while g/3 is still in
// it, so g/3 is left out of the batch, and queued, queuedBytes, ready and
// the tenant's count are one entry short: the caller of g/2 is answered
// twice, and g/3 is stranded. Had g/2 still been sendable by deadline and
// liveness it would have been sent after being answered as dropped.
func TestOneGroupTakeSkipsEntriesSweptBehindItsHead(t *testing.T) {
	q := newQueue(settings{maxEntries: 4, maxBytes: 10, maxInflight: 1, linger: 1, queueMax: 10, queueMaxBytes: 100, tenantMax: 10, oneGroup: true})
	g1, g2, g3 := fqEntry("a", "g", 1, math.MaxInt64), fqEntry("a", "g", 2, 5), fqEntry("a", "g", 3, math.MaxInt64)
	for _, e := range []*entry{g1, g2, g3} {
		_, ok := q.admit(e, 0)
		require.True(t, ok)
	}
	require.Equal(t, []*entry{g2}, q.sweep(6))
	batch, _, dropped := q.take(6)
	require.Empty(t, dropped, "g/2 was answered by the sweep")
	require.Equal(t, []*entry{g1, g3}, batch)
	require.Zero(t, q.queued)
}

func fqEntry(tenant, group string, n int, deadline int64) *entry {
	return withMsg(&entry{
		to:       caller{deliver: &messages.Deliver{Message: codec.Message{Tenant: tenant, Group: group}, Ref: fmt.Sprintf("%s/%s/%d", tenant, group, n)}},
		size:     1,
		deadline: deadline,
	})
}

// Seed programs. fqProgram encodes settings and operations as FuzzQueue
// decodes them.

type fqOp []byte

const fqNoDeadline = 15

func fqProgram(maxEntries, maxBytes, maxInflight, linger, queueMax, queueMaxBytes, tenantMax int, ops ...fqOp) []byte {
	b := []byte{byte(maxEntries - 1), byte(maxBytes - 1), byte(maxInflight - 1), byte(linger - 1),
		byte(queueMax - 1), byte(queueMaxBytes - 1), byte(tenantMax - 1)}
	for _, op := range ops {
		b = append(b, op...)
	}
	return b
}

// fqOneGroup makes a program's queue build one-group requests.
func fqOneGroup(program []byte) []byte {
	program[2] = 129 + program[2]%3 // keeps MaxInflight
	return program
}

// fqAdmit: tenant "a".."d"; group "", "g" or "h"; size 0..15; deadline in
// 0..11 is now+1+deadline, fqNoDeadline is none.
func fqAdmit(tenant, group string, size, deadline int) fqOp {
	g := map[string]int{"": 0, "g": 2, "h": 3}[group]
	return fqOp{byte(int(tenant[0]-'a')+4*g) << 3, byte(deadline<<4 | size)}
}

// fqEveryone and fqNotClass are arguments of fqTake and fqSweep.
const fqEveryone = 0

func fqNotClass(idMod8 int) byte { return byte(16 + idMod8) }

func fqTake(alive byte) fqOp  { return fqOp{alive<<3 | 3} }
func fqComplete(i int) fqOp   { return fqOp{byte(i)<<3 | 5} }
func fqSweep(alive byte) fqOp { return fqOp{alive<<3 | 6} }
func fqAdvance(d int) fqOp    { return fqOp{byte(d-1)<<3 | 7} }
func fqToggleDrain() fqOp     { return fqOp{24<<3 | 7} }
func fqDrainAll() fqOp        { return fqOp{30<<3 | 7} }

func fqSeeds() [][]byte {
	far := fqNoDeadline
	return [][]byte{
		// A flooding tenant is interleaved with the others.
		fqProgram(4, 16, 2, 5, 16, 64, 8,
			fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far),
			fqAdmit("b", "", 1, far), fqAdmit("b", "", 1, far), fqAdmit("c", "", 1, far),
			fqTake(fqEveryone), fqTake(fqEveryone), fqComplete(0), fqComplete(0)),
		// A group shared by tenants keeps its order and is gated while in flight.
		fqProgram(4, 16, 3, 5, 16, 64, 8,
			fqAdmit("a", "g", 1, far), fqAdmit("b", "g", 1, far), fqAdmit("a", "g", 1, far), fqAdmit("b", "", 1, far),
			fqTake(fqEveryone), fqAdmit("a", "g", 1, far), fqAdmit("c", "", 1, far), fqTake(fqEveryone), fqTake(fqEveryone),
			fqComplete(1), fqComplete(0), fqTake(fqEveryone)),
		// Ownership of a group moves between tenants within one batch.
		fqProgram(6, 16, 1, 5, 16, 64, 8,
			fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far), fqAdmit("a", "", 1, far),
			fqAdmit("b", "g", 1, far), fqAdmit("a", "g", 1, far), fqAdmit("b", "g", 1, far), fqAdmit("a", "g", 1, far),
			fqTake(fqEveryone), fqComplete(0), fqTake(fqEveryone)),
		// Batches stop before MaxBytes.
		fqProgram(6, 10, 3, 5, 16, 64, 8,
			fqAdmit("a", "", 4, far), fqAdmit("a", "", 4, far), fqAdmit("b", "", 4, far), fqAdmit("c", "h", 0, far),
			fqTake(fqEveryone), fqTake(fqEveryone), fqTake(fqEveryone)),
		// Each admission bound refuses.
		fqProgram(4, 16, 1, 5, 3, 20, 2,
			fqAdmit("a", "", 9, far), fqAdmit("a", "g", 9, far), fqAdmit("a", "", 1, far), fqAdmit("b", "", 5, far),
			fqAdmit("b", "", 1, far), fqAdmit("c", "", 1, far), fqTake(fqEveryone), fqAdmit("c", "", 1, far)),
		// Linger, draining and a full pipeline decide when a batch is due.
		fqProgram(4, 16, 1, 3, 16, 64, 8,
			fqAdmit("a", "", 1, far), fqAdvance(1), fqAdvance(2), fqTake(fqEveryone), fqAdmit("b", "", 1, far),
			fqToggleDrain(), fqComplete(0), fqAdvance(1), fqTake(fqEveryone), fqToggleDrain()),
		// Late and abandoned entries are dropped on the way, never sent.
		fqProgram(6, 16, 2, 5, 16, 64, 8,
			fqAdmit("a", "", 1, 0), fqAdmit("b", "g", 1, far), fqAdmit("c", "g", 1, far), fqAdmit("a", "", 1, far),
			fqAdvance(2), fqTake(fqNotClass(2)), fqComplete(0), fqTake(fqEveryone)),
		// Sweep and drainAll with a request in flight.
		fqProgram(2, 16, 2, 5, 16, 64, 8,
			fqAdmit("a", "g", 1, far), fqAdmit("a", "g", 1, far), fqAdmit("b", "", 1, 3), fqTake(fqEveryone),
			fqAdmit("a", "g", 1, 2), fqAdmit("c", "h", 1, far), fqAdvance(4), fqSweep(fqNotClass(5)),
			fqDrainAll(), fqComplete(0)),
		// Sweeps leave dead entries behind a live head until push compacts
		// the lane.
		fqProgram(4, 16, 1, 5, 16, 64, 8, slices.Concat(
			[]fqOp{fqAdmit("a", "", 1, far)},
			slices.Repeat([]fqOp{fqAdmit("a", "", 1, 0), fqAdvance(2), fqSweep(fqEveryone)}, 19),
			[]fqOp{fqAdmit("a", "", 1, far), fqTake(fqEveryone)})...),
		// A group lane that is taken from as it grows moves its entries down.
		fqProgram(2, 16, 1, 5, 16, 64, 8, slices.Concat(
			slices.Repeat([]fqOp{fqAdmit("a", "g", 1, far)}, 4),
			slices.Repeat([]fqOp{fqTake(fqEveryone), fqComplete(0), fqAdmit("b", "g", 1, far), fqAdmit("a", "g", 1, far)}, 10))...),
		// One group per request: the turn's lane decides the group; ungrouped
		// entries go round the tenants that have some.
		fqOneGroup(fqProgram(4, 16, 1, 5, 16, 64, 8,
			fqAdmit("a", "g", 1, far), fqAdmit("b", "", 1, far), fqAdmit("a", "", 1, far), fqAdmit("b", "g", 1, far),
			fqAdmit("c", "h", 1, far), fqAdmit("a", "g", 1, far), fqAdmit("c", "", 1, far), fqAdmit("d", "", 1, far),
			fqTake(fqEveryone), fqTake(fqEveryone), fqTake(fqEveryone), fqTake(fqEveryone))),
		// One group per request: a late head does not decide the group, and a
		// group's entries of other tenants ride along.
		fqOneGroup(fqProgram(3, 16, 2, 5, 16, 64, 8,
			fqAdmit("a", "g", 1, 0), fqAdmit("b", "", 1, far), fqAdvance(3), fqTake(fqEveryone),
			fqAdmit("a", "g", 1, far), fqAdmit("b", "g", 1, far), fqAdmit("a", "g", 1, far), fqAdmit("c", "", 1, far),
			fqTake(fqNotClass(5)), fqTake(fqEveryone), fqComplete(0), fqTake(fqEveryone))),
		// The sweep that TestSweepAfterMidLaneRemoval shows panicking.
		fqProgram(4, 16, 1, 5, 16, 64, 8,
			fqAdmit("a", "", 1, 9), fqAdmit("a", "", 1, 4), fqAdmit("a", "", 1, far),
			fqAdvance(6), fqSweep(fqEveryone), fqAdvance(5), fqSweep(fqEveryone)),
	}
}
