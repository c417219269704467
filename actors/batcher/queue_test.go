package batcher

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

const ms = int64(1e6)

func testSettings() settings {
	return settings{
		maxEntries: 4, maxBytes: 1000, maxInflight: 2, linger: 5 * ms,
		queueMax: 100, queueMaxBytes: 1 << 20, tenantMax: 50,
	}
}

// mk builds an entry named tenant/group/n with the given size.
func mk(tenant, group string, n, size int) *entry {
	return withMsg(&entry{
		to:       caller{deliver: &messages.Deliver{Message: codec.Message{Tenant: tenant, Group: group, Body: []byte(fmt.Sprint(n))}, Ref: fmt.Sprintf("%s/%s/%d", tenant, group, n)}},
		size:     int32(size),
		deadline: math.MaxInt64,
	})
}

// leaving marks e's caller as gone (Room.Leave), and returns e.
func leaving(e *entry) *entry {
	e.left = new(atomic.Bool)
	e.left.Store(true)
	return e
}

// withMsg points e's msg at its Deliver's message, as the actor does.
func withMsg(e *entry) *entry {
	e.msg = &e.to.deliver.Message
	return e
}

func refs(es []*entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.to.deliver.Ref.(string)
	}
	return out
}

func admitAll(t *testing.T, q *queue, es ...*entry) {
	t.Helper()
	for _, e := range es {
		_, ok := q.admit(e, 0)
		require.True(t, ok, "admit %s", e.to.deliver.Ref)
	}
}

// checkCounts recomputes the queue's counters from its lanes.
func checkCounts(t *testing.T, q *queue) {
	t.Helper()
	queued, ready := 0, 0
	var bytes, readyBytes int64
	perTenant := map[string]int{}
	count := func(l *lane) {
		for _, e := range l.entries[l.head:] {
			if e.dead {
				continue
			}
			queued++
			bytes += int64(e.size)
			perTenant[e.tenant.name]++
			if !l.gated {
				ready++
				readyBytes += int64(e.size)
			}
		}
	}
	for _, tn := range q.tenants {
		count(&tn.plain)
	}
	for _, l := range q.groups {
		count(l)
	}
	assert.Equal(t, queued, q.queued, "queued")
	assert.Equal(t, bytes, q.queuedBytes, "queuedBytes")
	assert.Equal(t, ready, q.ready, "ready")
	assert.Equal(t, readyBytes, q.readyBytes, "readyBytes")
	for name, tn := range q.tenants {
		assert.Equal(t, perTenant[name], tn.count, "tenant %q count", name)
	}
	assert.Len(t, q.tenants, len(perTenant), "no empty tenant is kept")
}

func TestTakeRoundRobinAcrossTenants(t *testing.T) {
	q := newQueue(testSettings())
	// Tenant a floods before b and c arrive; b and c must not wait behind a.
	admitAll(t, q, mk("a", "", 1, 1), mk("a", "", 2, 1), mk("a", "", 3, 1), mk("a", "", 4, 1),
		mk("b", "", 1, 1), mk("b", "", 2, 1), mk("c", "", 1, 1))
	b1, _, _ := q.take(0)
	assert.Equal(t, []string{"a//1", "b//1", "c//1", "a//2"}, refs(b1))
	b2, _, _ := q.take(0)
	assert.Equal(t, []string{"b//2", "a//3", "a//4"}, refs(b2))
	checkCounts(t, q)
	assert.Zero(t, q.queued)
	assert.Empty(t, q.tenants)
}

func TestGroupOrderAndGating(t *testing.T) {
	tests := []struct {
		name  string
		admit []*entry
		want  [][]string // batches, with each batch completed before the next is taken
	}{
		{
			name:  "a group's entries share a request in order",
			admit: []*entry{mk("a", "g", 1, 1), mk("a", "g", 2, 1), mk("a", "g", 3, 1)},
			want:  [][]string{{"a/g/1", "a/g/2", "a/g/3"}},
		},
		{
			name:  "a group shared by tenants keeps admission order",
			admit: []*entry{mk("a", "g", 1, 1), mk("b", "g", 1, 1), mk("a", "g", 2, 1), mk("b", "", 2, 1)},
			// b's turn takes its own ungrouped entry first, as g's head
			// moved to b's turn behind it; within g the order holds.
			want: [][]string{{"a/g/1", "b//2", "b/g/1", "a/g/2"}},
		},
		{
			name: "a batch stops at MaxEntries; the rest follows in order",
			admit: []*entry{mk("a", "g", 1, 1), mk("a", "g", 2, 1), mk("a", "g", 3, 1), mk("a", "g", 4, 1),
				mk("a", "g", 5, 1), mk("a", "g", 6, 1)},
			want: [][]string{{"a/g/1", "a/g/2", "a/g/3", "a/g/4"}, {"a/g/5", "a/g/6"}},
		},
		{
			name:  "a batch stops before MaxBytes",
			admit: []*entry{mk("a", "", 1, 400), mk("a", "", 2, 400), mk("a", "", 3, 400)},
			want:  [][]string{{"a//1", "a//2"}, {"a//3"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue(testSettings())
			admitAll(t, q, tc.admit...)
			for _, want := range tc.want {
				batch, groups, _ := q.take(0)
				assert.Equal(t, want, refs(batch))
				checkCounts(t, q)
				q.complete(groups)
			}
			assert.Zero(t, q.queued)
			assert.Empty(t, q.groups)
			assert.Zero(t, q.inflight)
		})
	}
}

func TestGatedGroupWaitsForItsResponse(t *testing.T) {
	q := newQueue(testSettings())
	admitAll(t, q, mk("a", "g", 1, 1), mk("a", "g", 2, 1))
	first, groups, _ := q.take(0)
	require.Equal(t, []string{"a/g/1", "a/g/2"}, refs(first))

	// More of g arrives while g's request is in flight: it is queued but not
	// sendable, and other tenants' entries are not held up behind it.
	admitAll(t, q, mk("a", "g", 3, 1), mk("b", "", 1, 1))
	assert.Equal(t, 2, q.queued)
	assert.Equal(t, 1, q.ready)
	second, groups2, _ := q.take(0)
	assert.Equal(t, []string{"b//1"}, refs(second))
	assert.Empty(t, groups2)
	third, _, _ := q.take(0)
	assert.Empty(t, third, "g is gated until its response")

	q.complete(groups2)
	q.complete(groups)
	assert.Equal(t, 1, q.ready)
	fourth, _, _ := q.take(0)
	assert.Equal(t, []string{"a/g/3"}, refs(fourth))
	checkCounts(t, q)
}

func TestTakeSkipsAGatedGroupWithoutScanningIt(t *testing.T) {
	s := testSettings()
	s.queueMax, s.tenantMax = 1<<20, 1<<20
	q := newQueue(s)
	admitAll(t, q, mk("a", "g", 0, 1))
	_, groups, _ := q.take(0)
	// The gated group's callers have left: a take that looked at any of
	// them would drop it.
	for i := 1; i <= 50000; i++ {
		admitAll(t, q, leaving(mk("a", "g", i, 1)))
	}
	admitAll(t, q, mk("a", "", 1, 1))
	batch, _, dropped := q.take(0)
	assert.Equal(t, []string{"a//1"}, refs(batch))
	assert.Empty(t, dropped, "take looked at the gated group's entries")
	q.complete(groups)
	assert.Equal(t, 50000, q.ready)
}

func TestAdmitBounds(t *testing.T) {
	tests := []struct {
		name   string
		tune   func(*settings)
		admit  []*entry
		refuse *entry
		reason messages.FullReason
	}{
		{"entries", func(s *settings) { s.queueMax = 2 },
			[]*entry{mk("a", "", 1, 1), mk("b", "", 1, 1)}, mk("c", "", 1, 1), messages.FullEntries},
		{"bytes", func(s *settings) { s.queueMaxBytes = 10 },
			[]*entry{mk("a", "", 1, 6)}, mk("b", "", 1, 5), messages.FullBytes},
		{"tenant", func(s *settings) { s.tenantMax = 2 },
			[]*entry{mk("a", "", 1, 1), mk("a", "g", 2, 1), mk("b", "", 1, 1)}, mk("a", "", 3, 1), messages.FullTenant},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testSettings()
			tc.tune(&s)
			q := newQueue(s)
			admitAll(t, q, tc.admit...)
			before := q.queued
			reason, ok := q.admit(tc.refuse, 0)
			require.False(t, ok)
			assert.Equal(t, tc.reason, reason)
			assert.Equal(t, before, q.queued, "a refused entry is not queued")
			checkCounts(t, q)
		})
	}
}

func TestDue(t *testing.T) {
	s := testSettings()
	q := newQueue(s)
	_, ok := q.due(100 * ms)
	assert.False(t, ok, "nothing queued")

	_, _ = q.admit(mk("a", "", 1, 1), 10*ms)
	_, ok = q.due(14 * ms)
	assert.False(t, ok, "linger not yet over")
	assert.Equal(t, 15*ms, q.wake())
	trig, ok := q.due(15 * ms)
	require.True(t, ok)
	assert.Equal(t, telemetry.TriggerLinger, trig)

	admitAll(t, q, mk("a", "", 2, 1), mk("a", "", 3, 1), mk("a", "", 4, 1))
	trig, _ = q.due(10 * ms)
	assert.Equal(t, telemetry.TriggerEntries, trig)

	_, _, _ = q.take(20 * ms)
	_, _ = q.admit(mk("a", "", 5, 1000), 21*ms)
	trig, ok = q.due(21 * ms)
	require.True(t, ok)
	assert.Equal(t, telemetry.TriggerBytes, trig)

	_, _, _ = q.take(21 * ms)
	_, _ = q.admit(mk("a", "", 6, 1), 22*ms)
	_, ok = q.due(100 * ms)
	assert.False(t, ok, "MaxInflight requests are in flight")
	assert.Zero(t, q.wake(), "a full pipeline waits for a response, not for linger")

	q.complete(nil)
	_, ok = q.due(22 * ms)
	assert.False(t, ok, "linger counts from the last batch")
	q.draining = true
	trig, ok = q.due(22 * ms)
	require.True(t, ok)
	assert.Equal(t, telemetry.TriggerDrain, trig)
}

func TestAbandonedEntriesAreNeverSent(t *testing.T) {
	q := newQueue(testSettings())
	late := mk("a", "", 1, 1)
	late.deadline = 5 * ms
	gone := mk("b", "", 1, 1)
	kept := mk("c", "", 1, 1)
	admitAll(t, q, late, gone, kept)
	leaving(gone)
	batch, _, dropped := q.take(5 * ms)
	assert.Equal(t, []string{"c//1"}, refs(batch))
	assert.ElementsMatch(t, []string{"a//1", "b//1"}, refs(dropped))
	checkCounts(t, q)
}

func TestSweepFreesRoomHeldByAbandonedEntries(t *testing.T) {
	s := testSettings()
	s.queueMax = 3
	q := newQueue(s)
	a, b, c := mk("a", "g", 1, 1), mk("a", "g", 2, 1), mk("b", "", 1, 1)
	b.deadline = 7 * ms
	admitAll(t, q, a, b, c)
	_, ok := q.admit(mk("d", "", 1, 1), 0)
	require.False(t, ok)
	assert.Equal(t, 7*ms, q.minDeadline)

	leaving(c)
	dropped := q.sweep(8 * ms)
	assert.ElementsMatch(t, []string{"a/g/2", "b//1"}, refs(dropped))
	assert.Equal(t, int64(math.MaxInt64), q.minDeadline)
	checkCounts(t, q)
	admitAll(t, q, mk("d", "", 1, 1), mk("e", "", 1, 1))
	batch, _, _ := q.take(8 * ms)
	assert.Equal(t, []string{"a/g/1", "d//1", "e//1"}, refs(batch))
}

func TestLaneCompactsDeadEntries(t *testing.T) {
	s := testSettings()
	s.queueMax, s.tenantMax = 1<<20, 1<<20
	q := newQueue(s)
	admitAll(t, q, mk("a", "g", 0, 1))
	_, groups, _ := q.take(0) // gate g so its lane only grows
	for i := 1; i <= 1000; i++ {
		e := mk("a", "g", i, 1)
		e.deadline = int64(i)
		admitAll(t, q, e)
		if i%2 == 0 {
			q.sweep(int64(i))
		}
	}
	l := q.groups["g"]
	assert.Less(t, len(l.entries)-l.head, 100, "dead entries are compacted away")
	checkCounts(t, q)
	q.complete(groups)
}

func TestDrainAll(t *testing.T) {
	q := newQueue(testSettings())
	admitAll(t, q, mk("a", "g", 1, 1), mk("b", "", 1, 1), mk("a", "g", 2, 1))
	_, _, _ = q.take(0)
	admitAll(t, q, mk("a", "g", 3, 1), mk("c", "", 1, 1))
	all := q.drainAll()
	assert.ElementsMatch(t, []string{"a/g/3", "c//1"}, refs(all))
	assert.Zero(t, q.queued)
	assert.Zero(t, q.queuedBytes)
	assert.Equal(t, 1, q.inflight)
	checkCounts(t, q)
}

func TestOneGroupPerRequest(t *testing.T) {
	s := testSettings()
	s.oneGroup = true
	q := newQueue(s)
	admitAll(t, q,
		mk("a", "g1", 1, 1), mk("b", "", 1, 1), mk("a", "", 2, 1), mk("b", "g1", 2, 1),
		mk("c", "g2", 1, 1), mk("a", "g1", 3, 1), mk("c", "", 2, 1))
	var batches [][]string
	for q.queued > 0 {
		batch, groups, _ := q.take(0)
		require.NotEmpty(t, batch)
		batches = append(batches, refs(batch))
		group := batch[0].msg.Group
		for _, e := range batch {
			assert.Equal(t, group, e.msg.Group, "one group per request")
		}
		checkCounts(t, q)
		q.complete(groups)
	}
	assert.Equal(t, [][]string{
		{"a/g1/1", "b/g1/2", "a/g1/3"}, // a's turn: its first lane is g1, in admission order across tenants
		{"b//1", "c//2", "a//2"},       // b's turn: ungrouped, round-robin from b over the tenants that have some
		{"c/g2/1"},                     // c's turn: g2
	}, batches)
	assert.Empty(t, q.groups)
	assert.Empty(t, q.tenants)
	assert.Zero(t, q.ringLen)
}

func TestOneGroupPerRequestGatesAndDrops(t *testing.T) {
	s := testSettings()
	s.oneGroup = true
	q := newQueue(s)
	late := mk("a", "g", 1, 1)
	late.deadline = 1
	admitAll(t, q, late, mk("b", "", 1, 1))
	batch, groups, dropped := q.take(5)
	assert.Equal(t, []string{"b//1"}, refs(batch), "the abandoned head does not decide the group")
	assert.Equal(t, []string{"a/g/1"}, refs(dropped))
	q.complete(groups)

	admitAll(t, q, mk("a", "g", 2, 1), mk("a", "g", 3, 1))
	gone := q.groups["g"].entries[q.groups["g"].head+1]
	leaving(gone)
	first, groups, _ := q.take(5)
	assert.Equal(t, []string{"a/g/2"}, refs(first))
	admitAll(t, q, mk("a", "g", 4, 1), mk("b", "", 2, 1))
	second, _, _ := q.take(5)
	assert.Equal(t, []string{"b//2"}, refs(second), "g is gated")
	q.complete(groups)
	third, _, _ := q.take(5)
	assert.Equal(t, []string{"a/g/4"}, refs(third))
	checkCounts(t, q)
}
