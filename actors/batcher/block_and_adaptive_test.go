package batcher

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/internal/mono"
	"github.com/ankusa/sinkbatch/messages"
)

// keyed is mk with an IdempotencyKey.
func keyed(tenant, group string, n int, key string) *entry {
	e := mk(tenant, group, n, 1)
	e.to.deliver.Message.IdempotencyKey = key
	return e
}

func strictSettings() settings {
	s := testSettings()
	s.strict, s.pauseMax = true, int64(30*time.Second)
	s.maxEntries, s.linger = 1, 0
	return s
}

func blockSettings(queueMax int) settings {
	s := testSettings()
	s.block, s.queueMax, s.linger, s.maxEntries = true, queueMax, 0, 1
	return s
}

// A delivery that does not fit waits; waiters are admitted as room frees,
// round-robin across tenants, in order within a tenant. At most QueueMax
// deliveries wait: past that, a tenant with fewer waiters takes the place
// of the newest waiter of the tenant with most (answered as refused), and
// otherwise the delivery is refused as with Refuse.
func TestBlockWaitersAreAdmittedRoundRobin(t *testing.T) {
	d := handoffDispatch(blockSettings(2))
	d.q.s.maxInflight = 8
	now := int64(1000)
	for _, e := range []*entry{mk("a", "", 1, 1), mk("a", "", 2, 1)} {
		require.True(t, d.admit(e, now, false).ok)
	}
	a4 := mk("a", "", 4, 1)
	for _, e := range []*entry{mk("a", "", 3, 1), a4} {
		a := d.admit(e, now, false)
		require.True(t, a.waiting, "a/%s waits", e.msg.Body)
	}
	a := d.admit(mk("b", "", 1, 1), now, false)
	assert.True(t, a.waiting, "b/1 takes the place of a's newest waiter")
	assert.Equal(t, a4, a.evicted)
	a = d.admit(mk("c", "", 1, 1), now, false)
	assert.False(t, a.waiting, "a and b wait one each: c is refused")
	assert.Nil(t, a.evicted)
	assert.Equal(t, messages.FullEntries, a.reason)
	assert.Equal(t, 2, d.status(now).waiting)
	assert.True(t, d.status(now).held, "a batcher with waiters is not idle")

	f1, _ := launchAt(d, now) // a/1 leaves: a/3 is admitted
	f2, _ := launchAt(d, now) // a/2 leaves: b/1
	assert.Equal(t, []string{"a//1"}, refs(f1.entries))
	assert.Equal(t, []string{"a//2"}, refs(f2.entries))
	assert.Equal(t, 0, d.status(now).waiting)
	f3, _ := launchAt(d, now)
	f4, _ := launchAt(d, now)
	assert.ElementsMatch(t, []string{"a//3", "b//1"}, append(refs(f3.entries), refs(f4.entries)...))
	checkCounts(t, d.q)
}

// While anything waits, a delivery waits too, though it fits: the room that
// frees is the waiters' in their turn. A group's waiters are admitted in
// their order across tenants.
func TestBlockKeepsTenantAndGroupOrder(t *testing.T) {
	s := blockSettings(10)
	s.tenantMax = 1
	q := newQueue(s)
	now := int64(0)
	admitAll(t, q, mk("a", "", 0, 1), mk("b", "", 0, 1))
	// a's waiters: h (ungrouped), then g/1; b's: g/2, which arrived later.
	for _, e := range []*entry{mk("a", "", 1, 1), mk("a", "g", 1, 1), mk("b", "g", 2, 1)} {
		_, ok := q.admit(e, now)
		require.False(t, ok)
		require.True(t, q.wait(e))
	}
	// c fits, but waits for its turn; so does a new delivery of g.
	reason, ok := q.admit(mk("c", "", 1, 1), now)
	assert.False(t, ok)
	assert.Equal(t, messages.FullEntries, reason)
	_, ok = q.admit(mk("c", "g", 3, 1), now)
	assert.False(t, ok)
	q.s.tenantMax = 10
	assert.Empty(t, q.promote(now))
	assert.Equal(t, 0, q.waits.n)
	l := q.groups["g"]
	assert.Equal(t, []string{"a/g/1", "b/g/2"}, refs(l.appendLive(nil)))
	checkCounts(t, q)
}

// The waiter whose turn it is keeps it until the room it needs frees: a
// smaller waiter behind it does not take the room freed meanwhile (a large
// message would starve beside small ones). A waiter held by its own
// tenant's bound passes its turn on.
func TestBlockTheWaiterWhoseTurnItIsKeepsIt(t *testing.T) {
	s := blockSettings(10)
	s.queueMaxBytes, s.maxBytes = 1000, 1000
	d := handoffDispatch(s)
	d.q.s.maxInflight = 8
	now := int64(0)
	for i := range 9 {
		require.True(t, d.admit(mk("small", "", i, 100), now, false).ok)
	}
	big := mk("big", "", 1, 800)
	require.True(t, d.admit(big, now, false).waiting)
	small := mk("small", "", 99, 100)
	require.True(t, d.admit(small, now, false).waiting, "it fits, but the big waiter's turn comes first")
	for range 6 { // 900 bytes queued, then 800, ... 300
		f, _ := launchAt(d, now)
		require.NotNil(t, f)
		assert.Nil(t, big.lane, "not yet room for big")
		assert.Nil(t, small.lane, "small waits for big")
	}
	f, _ := launchAt(d, now) // 200 bytes queued: big fits
	require.NotNil(t, f)
	assert.NotNil(t, big.lane, "big is admitted as soon as its room has freed")
	checkCounts(t, d.q)

	s = blockSettings(10)
	s.tenantMax = 1
	q := newQueue(s)
	admitAll(t, q, mk("a", "", 0, 1))
	a1, b1 := mk("a", "", 1, 1), mk("b", "", 1, 1)
	require.True(t, q.wait(a1))
	require.True(t, q.wait(b1))
	assert.Empty(t, q.promote(now))
	assert.NotNil(t, b1.lane, "a's own bound holds a1; b1 takes its turn")
	assert.Nil(t, a1.lane)
}

// A waiter whose deadline passes is removed, to be answered; it was never
// queued.
func TestBlockWaiterDeadline(t *testing.T) {
	s := blockSettings(1)
	s.linger = int64(time.Hour)
	q := newQueue(s)
	admitAll(t, q, mk("a", "", 0, 1))
	e := mk("a", "", 1, 1)
	e.deadline = 50
	require.True(t, q.wait(e))
	assert.Equal(t, int64(50), q.wake())
	assert.Empty(t, q.sweepWaiters(49))
	assert.Equal(t, []*entry{e}, q.sweepWaiters(50))
	assert.Equal(t, 0, q.waits.n)
	assert.Empty(t, q.waits.tenants, "no empty tenant is kept")
	assert.Equal(t, 1, q.queued)
}

// Stop's drain answers waiters (ErrStopped, by the actor), and a delivery
// that does not fit while draining does not wait.
func TestBlockDrainReturnsWaiters(t *testing.T) {
	d := handoffDispatch(blockSettings(1))
	now := int64(0)
	require.True(t, d.admit(mk("a", "", 0, 1), now, false).ok)
	w := mk("a", "", 1, 1)
	require.True(t, d.admit(w, now, false).waiting)
	assert.Equal(t, []*entry{w}, d.setDraining())
	a := d.admit(mk("a", "", 2, 1), now, false)
	assert.True(t, a.stopped)
}

// The limiter grows by one per window while request time stays near its
// no-load baseline and requests reach the limit, and shrinks by 0.9 (at
// least one) on throttling or when request time rises past 1.3 × the
// baseline. It never leaves [1, max], and it learns a destination that
// became slower for good.
func TestLimiterAIMD(t *testing.T) {
	const rtt = int64(5 * time.Millisecond)
	l := newLimiter(8)
	now := int64(0)
	// window runs requests of d, each reaching the limit, until a window
	// ends.
	window := func(d int64, ok, pressured bool) {
		for {
			due := !l.past.set || now+d >= l.nextUpdate
			l.started(l.limit)
			now += d
			l.ended(now, d, ok, pressured)
			if due {
				return
			}
		}
	}
	for range 40 {
		window(rtt, true, false)
	}
	assert.Equal(t, 8, l.limit, "steady request time: grows to the max and stays")
	window(rtt, false, true)
	assert.Equal(t, 7, l.limit, "throttled: ⌊8×0.9⌋")
	for range 3 {
		window(rtt, false, true)
	}
	assert.Equal(t, 4, l.limit)
	window(rtt*14/10, true, false)
	assert.Equal(t, 3, l.limit, "request time 1.4 × the baseline")
	window(rtt*12/10, true, false)
	assert.Equal(t, 4, l.limit, "1.2 × the baseline is near enough to grow")
	for range 50 {
		window(rtt, false, true)
	}
	assert.Equal(t, 1, l.limit, "never below 1")
	for range 30 {
		window(2*rtt, true, false)
	}
	assert.Greater(t, l.limit, 4, "a destination twice as slow at limit 1 is the new baseline")

	idle := newLimiter(8)
	for i := range 40 {
		idle.started(0) // never reaches the limit: no evidence for more
		idle.ended(int64(i+1)*rtt, rtt, true, false)
	}
	assert.Equal(t, 1, idle.limit)
}

// An adaptive dispatch sends at most its limit in flight.
func TestAdaptiveLimitBoundsTheQueue(t *testing.T) {
	s := testSettings()
	s.maxInflight, s.linger, s.maxEntries = 1, 0, 1
	d := handoffDispatch(s)
	d.lim = newLimiter(8)
	admitNow(t, d, mk("a", "", 1, 1), mk("a", "", 2, 1), mk("a", "", 3, 1))
	f := take(d)
	require.NotNil(t, f)
	assert.Nil(t, take(d), "limit 1")
	r := d.finishWith(f, mono.Now(), outcome{rtt: int64(time.Millisecond), ok: true})
	require.NotNil(t, r.next)
	r = d.finishWith(r.next, mono.Now()+int64(time.Second), outcome{rtt: int64(time.Millisecond), ok: true})
	assert.Equal(t, 2, d.q.s.maxInflight, "a window later with the limit reached: 2")
	assert.Equal(t, 2, r.limit)
}

// launchAt launches one batch at now.
func launchAt(d *dispatch, now int64) (*inflight, []*entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.launchLocked(now)
}

// A full waiting list does not give away a waiter that a later waiter of
// its group stands behind: that one would overtake it.
func TestBlockEvictionKeepsGroupOrder(t *testing.T) {
	q := newQueue(blockSettings(3))
	admitAll(t, q, mk("x", "", 0, 1), mk("x", "", 1, 1), mk("x", "", 2, 1))
	g1, a2 := mk("a", "g", 1, 1), mk("a", "", 2, 1)
	require.True(t, q.wait(g1))
	require.True(t, q.wait(a2))
	assert.Equal(t, a2, q.evictFor(mk("c", "", 1, 1)), "a's newest waiter, ungrouped, gives its place")
	a3, g2 := mk("a", "", 3, 1), mk("b", "g", 2, 1)
	require.True(t, q.wait(g2))
	require.True(t, q.wait(a3))
	assert.Equal(t, a3, q.evictFor(mk("c", "", 1, 1)))
	// a: g/1; b: g/2. A second waiter of a, grouped g, is a's newest.
	g3 := mk("a", "g", 3, 1)
	require.True(t, q.wait(g3))
	assert.Equal(t, g3, q.evictFor(mk("c", "", 1, 1)), "g/3 is g's last waiter: nobody stands behind it")
	h := mk("a", "h", 4, 1)
	require.True(t, q.wait(h))
	q.waits.remove(g2)
	g4 := mk("b", "g", 5, 1)
	require.True(t, q.wait(g4))
	// a: g/1, h/4 (newest); b: g/5. h's is last in its group: evictable.
	assert.Equal(t, h, q.evictFor(mk("c", "", 1, 1)))
	g6 := mk("a", "g", 6, 1)
	require.True(t, q.wait(g6))
	q.waits.remove(g4)
	require.True(t, q.wait(mk("b", "g", 7, 1)))
	// a: g/1, g/6 (newest); b: g/7, later in g than g/6.
	assert.Nil(t, q.evictFor(mk("c", "", 1, 1)), "g/7 of b stands behind a's newest, g/6")
}

// A sweep that removes a tenant's first waiter, after a later one was
// removed already, steps over the slot the head's advance cleared.
func TestBlockSweepAfterARemovalBehindTheHead(t *testing.T) {
	s := blockSettings(4)
	s.strict, s.pauseMax = true, 100
	q := newQueue(s)
	admitAll(t, q, mk("x", "", 0, 1), mk("x", "", 1, 1), mk("x", "", 2, 1), mk("x", "", 3, 1))
	first, g, last := mk("a", "", 1, 1), mk("a", "g", 2, 1), mk("a", "", 3, 1)
	first.deadline = 10
	for _, e := range []*entry{first, g, last} {
		require.True(t, q.wait(e))
	}
	g.rank, first.rank, last.rank = 2, 1, 3
	q.waits.remove(g) // takes g/2 out of the middle
	assert.Equal(t, []*entry{first}, q.sweepWaiters(10))
	assert.Equal(t, 1, q.waits.n)
}
