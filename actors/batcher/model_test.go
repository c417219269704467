package batcher

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// refModel is the reference FuzzQueue holds queue to: the batching rules
// restated with slices and linear scans. It keeps no counter that a scan can
// recompute, so a counter drifting in queue shows up as a difference.
//
// The rules, as the model states them:
//
//   - A lane is what must leave in order: one group's entries across tenants,
//     or one tenant's ungrouped entries. A group is gated while a request
//     holding some of its entries is in flight; nothing of a gated group is
//     sendable.
//   - A lane with entries that is not gated is owned by the tenant of its
//     oldest entry. Tenants owning a lane take turns in ring order (ring[0]
//     is next); a tenant that comes to own a lane when it owned none joins
//     the ring last, and one left owning none leaves it. Within a tenant its
//     lanes take turns the same way (turns[t][0] is next).
//   - Admission refuses, in this order, at QueueMax entries, at QueueMaxBytes
//     bytes, at TenantMax entries of the tenant; every queued entry counts,
//     gated or not, none in flight does.
//   - A turn sends the oldest entry of the tenant's next lane, then passes to
//     the next tenant, and within the tenant to its next lane. An entry found
//     late or abandoned on the way is dropped and uses no turn. A batch ends
//     at MaxEntries, at the first entry that would pass MaxBytes, or when no
//     tenant is in turn; then its groups are gated, and if it is not empty it
//     is one more request in flight.
//
// Which tenant goes first after a sweep depends on the order in which queue
// visits its maps, which Go leaves unspecified, so after a sweep the model
// checks that the same tenants and lanes are in turn and then adopts queue's
// order (adoptOrder).
type refModel struct {
	s          settings
	lanes      map[string]*refLane   // by refLane.key; empty only while gated
	ring       []string              // tenants owning a lane, next turn first
	turns      map[string][]*refLane // the lanes each tenant in ring owns, next first
	inflight   int
	lingerFrom int64
	draining   bool
}

// refEntry is the model's twin of one admitted entry.
type refEntry struct {
	id       int
	name     string // tenant/group/id, for messages
	tenant   string
	group    string
	size     int
	deadline int64
}

type refLane struct {
	key     string // "g:"+group, or "t:"+tenant for its ungrouped entries
	group   string
	entries []*refEntry // queued, in admission order
	gated   bool
	owner   string // the tenant whose turns hold this lane; "" when none
}

func newRefModel(s settings) *refModel {
	return &refModel{s: s, lanes: map[string]*refLane{}, turns: map[string][]*refLane{}}
}

func refLaneKey(tenant, group string) string {
	if group != "" {
		return "g:" + group
	}
	return "t:" + tenant
}

// refTotals are the counts queue keeps incrementally, recomputed.
type refTotals struct {
	Queued, Ready           int
	QueuedBytes, ReadyBytes int64
	Inflight                int
}

func (m *refModel) totals() (refTotals, map[string]int) {
	tot := refTotals{Inflight: m.inflight}
	perTenant := map[string]int{}
	for _, l := range m.lanes {
		for _, e := range l.entries {
			tot.Queued++
			tot.QueuedBytes += int64(e.size)
			perTenant[e.tenant]++
			if !l.gated {
				tot.Ready++
				tot.ReadyBytes += int64(e.size)
			}
		}
	}
	return tot, perTenant
}

func (m *refModel) admit(e *refEntry, now int64) (messages.FullReason, bool) {
	tot, perTenant := m.totals()
	switch {
	case tot.Queued >= m.s.queueMax:
		return messages.FullEntries, false
	case tot.QueuedBytes+int64(e.size) > m.s.queueMaxBytes:
		return messages.FullBytes, false
	case perTenant[e.tenant] >= m.s.tenantMax:
		return messages.FullTenant, false
	}
	if tot.Queued == 0 {
		m.lingerFrom = now
	}
	key := refLaneKey(e.tenant, e.group)
	l := m.lanes[key]
	if l == nil {
		l = &refLane{key: key, group: e.group}
		m.lanes[key] = l
	}
	l.entries = append(l.entries, e)
	m.settle(l)
	return 0, true
}

func (m *refModel) due(now int64) (telemetry.Trigger, bool) {
	tot, _ := m.totals()
	switch {
	case tot.Ready == 0 || m.inflight >= m.s.maxInflight:
		return 0, false
	case tot.Ready >= m.s.maxEntries:
		return telemetry.TriggerEntries, true
	case tot.ReadyBytes >= int64(m.s.maxBytes):
		return telemetry.TriggerBytes, true
	case m.draining:
		return telemetry.TriggerDrain, true
	case now-m.lingerFrom >= m.s.linger:
		return telemetry.TriggerLinger, true
	}
	return 0, false
}

func (m *refModel) take(now int64, alive func(*refEntry) bool) (batch []*refEntry, groups []*refLane, dropped []*refEntry) {
	if m.s.oneGroup {
		return m.takeOneGroup(now, alive)
	}
	bytes := 0
	for len(batch) < m.s.maxEntries && len(m.ring) > 0 {
		t := m.ring[0]
		l := m.turns[t][0]
		e := l.entries[0]
		if e.deadline <= now || !alive(e) {
			l.entries = l.entries[1:]
			dropped = append(dropped, e)
			m.settle(l)
			continue
		}
		if bytes+e.size > m.s.maxBytes {
			break
		}
		l.entries = l.entries[1:]
		batch = append(batch, e)
		bytes += e.size
		if l.group != "" && !slices.Contains(groups, l) {
			groups = append(groups, l)
		}
		m.turns[t] = refRotate(m.turns[t])
		m.ring = refRotate(m.ring)
		m.settle(l)
	}
	for _, l := range groups {
		l.gated = true
		m.settle(l)
	}
	if len(batch) > 0 {
		m.inflight++
		m.lingerFrom = now
	}
	m.tidy()
	return batch, groups, dropped
}

// takeOneGroup is take for destinations whose requests hold one group
// (settings.oneGroup). Abandoned heads are dropped until a live one decides
// the batch by the lane it stands in: a group's lane fills the batch in its
// own order, whoever its entries belong to, and the turn passes on; an
// ungrouped lane starts a batch of ungrouped entries only, taken round-robin
// over the tenants, passing over those that have none, one lap at most. Only
// an ungrouped batch restarts the linger clock: a group's later entries
// gather behind its gate.
func (m *refModel) takeOneGroup(now int64, alive func(*refEntry) bool) (batch []*refEntry, groups []*refLane, dropped []*refEntry) {
	late := func(e *refEntry) bool { return e.deadline <= now || !alive(e) }
	drop := func(l *refLane) {
		dropped = append(dropped, l.entries[0])
		l.entries = l.entries[1:]
		m.settle(l)
	}
	for len(m.ring) > 0 && late(m.turns[m.ring[0]][0].entries[0]) {
		drop(m.turns[m.ring[0]][0])
	}
	if len(m.ring) == 0 {
		m.tidy()
		return nil, nil, dropped
	}
	bytes := 0
	t := m.ring[0]
	if l := m.turns[t][0]; l.group != "" {
		for len(batch) < m.s.maxEntries && len(l.entries) > 0 {
			e := l.entries[0]
			if late(e) {
				// Dropped without settling: the lane stays t's until the
				// batch leaves, even if the entries behind belong to
				// others.
				dropped = append(dropped, e)
				l.entries = l.entries[1:]
				continue
			}
			if bytes+e.size > m.s.maxBytes {
				break
			}
			l.entries = l.entries[1:] // ownership moves once the batch leaves
			batch = append(batch, e)
			bytes += e.size
		}
		if l.owner == t {
			m.turns[t] = refRotate(m.turns[t])
		}
		if len(m.turns[t]) > 0 {
			m.ring = refRotate(m.ring)
		}
		if len(batch) > 0 {
			l.gated = true
			groups = []*refLane{l}
		}
		m.settle(l)
	} else {
		for misses := 0; len(batch) < m.s.maxEntries && len(m.ring) > 0 && misses < len(m.ring); {
			t := m.ring[0]
			p := m.lanes[refLaneKey(t, "")]
			if p == nil || p.owner != t {
				m.ring = refRotate(m.ring)
				misses++
				continue
			}
			e := p.entries[0]
			if late(e) {
				drop(p)
				continue
			}
			if bytes+e.size > m.s.maxBytes {
				break
			}
			p.entries = p.entries[1:]
			batch = append(batch, e)
			bytes += e.size
			misses = 0
			if m.turns[t][0] == p {
				m.turns[t] = refRotate(m.turns[t])
			}
			m.ring = refRotate(m.ring)
			m.settle(p)
		}
		if len(batch) > 0 {
			m.lingerFrom = now // only an ungrouped batch restarts the linger clock
		}
	}
	if len(batch) > 0 {
		m.inflight++
	}
	m.tidy()
	return batch, groups, dropped
}

func (m *refModel) complete(groups []*refLane) {
	m.inflight--
	for _, l := range groups {
		l.gated = false
		m.settle(l)
	}
	m.tidy()
}

// sweep removes what has expired or been abandoned. The turn order it
// leaves is queue's to choose: see adoptOrder.
func (m *refModel) sweep(now int64, alive func(*refEntry) bool) (dropped []*refEntry) {
	for _, key := range slices.Sorted(maps.Keys(m.lanes)) {
		l := m.lanes[key]
		l.entries = slices.DeleteFunc(l.entries, func(e *refEntry) bool {
			if e.deadline <= now || !alive(e) {
				dropped = append(dropped, e)
				return true
			}
			return false
		})
		m.settle(l)
	}
	m.tidy()
	return dropped
}

func (m *refModel) drainAll() (all []*refEntry) {
	for _, key := range slices.Sorted(maps.Keys(m.lanes)) {
		l := m.lanes[key]
		all = append(all, l.entries...)
		l.entries = nil
		m.settle(l)
	}
	m.tidy()
	return all
}

// settle moves l to the turns of the tenant that owns it now, if that
// changed.
func (m *refModel) settle(l *refLane) {
	want := ""
	if len(l.entries) > 0 && !l.gated {
		want = l.entries[0].tenant
	}
	if l.owner == want {
		return
	}
	if old := l.owner; old != "" {
		m.turns[old] = slices.DeleteFunc(m.turns[old], func(x *refLane) bool { return x == l })
		if len(m.turns[old]) == 0 {
			delete(m.turns, old)
			m.ring = slices.DeleteFunc(m.ring, func(x string) bool { return x == old })
		}
	}
	if want != "" {
		if len(m.turns[want]) == 0 {
			m.ring = append(m.ring, want)
		}
		m.turns[want] = append(m.turns[want], l)
	}
	l.owner = want
}

// tidy forgets lanes with nothing queued and no request in flight.
func (m *refModel) tidy() {
	maps.DeleteFunc(m.lanes, func(_ string, l *refLane) bool { return len(l.entries) == 0 && !l.gated })
}

// refTurn is one tenant in turn and its lanes, next first.
type refTurn struct {
	Tenant string
	Lanes  []string // refLane.key
}

// turnOrder is the ring and turns, next first.
func (m *refModel) turnOrder() []refTurn {
	out := []refTurn{}
	for _, t := range m.ring {
		keys := []string{}
		for _, l := range m.turns[t] {
			keys = append(keys, l.key)
		}
		out = append(out, refTurn{t, keys})
	}
	return out
}

// adoptOrder takes the turn order from order, which must hold the same
// tenants and lanes as the model's, in any order.
func (m *refModel) adoptOrder(order []refTurn) error {
	if !slices.EqualFunc(refSortedTurns(order), refSortedTurns(m.turnOrder()), func(a, b refTurn) bool {
		return a.Tenant == b.Tenant && slices.Equal(a.Lanes, b.Lanes)
	}) {
		return fmt.Errorf("tenants and lanes in turn differ:\nmodel %v\nqueue %v", m.turnOrder(), order)
	}
	m.ring = nil
	m.turns = map[string][]*refLane{}
	for _, tt := range order {
		m.ring = append(m.ring, tt.Tenant)
		for _, key := range tt.Lanes {
			m.turns[tt.Tenant] = append(m.turns[tt.Tenant], m.lanes[key])
		}
	}
	return nil
}

func refSortedTurns(order []refTurn) []refTurn {
	out := make([]refTurn, len(order))
	for i, tt := range order {
		out[i] = refTurn{tt.Tenant, slices.Sorted(slices.Values(tt.Lanes))}
	}
	slices.SortFunc(out, func(a, b refTurn) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

func refRotate[T any](s []T) []T {
	return append(slices.Clone(s[1:]), s[0])
}

func refNames(es []*refEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.name
	}
	return out
}
