package batcher

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
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

func heldRefs(hs []heldEntry) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.e.to.deliver.Ref.(string)
	}
	return out
}

// A retryable failure of g/1 pauses g before its gate opens: g's queued
// followers are taken out and answered GroupPausedError naming g/1's key,
// new deliveries of g are answered the same, and g/1's retry resumes g and
// goes first.
func TestStrictFailurePausesTheGroupUntilTheRetry(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2"), keyed("b", "g", 3, "k3"), keyed("a", "h", 1, "h1")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))
	r := d.finishWith(f, now, outcome{failures: []groupFailure{{group: "g", key: "k1"}}})
	assert.Equal(t, []string{"a/g/2", "b/g/3"}, heldRefs(r.held))
	for _, h := range r.held {
		assert.Equal(t, &messages.GroupPausedError{Group: "g", Key: "k1"}, h.err)
	}
	assert.Equal(t, []groupFailure{{group: "g", key: "k1"}}, r.paused)
	require.NotNil(t, r.next, "other groups go on")
	assert.Equal(t, []string{"a/h/1"}, refs(r.next.entries))
	assert.Equal(t, []string{"g"}, d.pausedGroups(now))
	checkCounts(t, d.q)

	a := d.admit(keyed("a", "g", 4, "k4"), now, false)
	require.False(t, a.ok)
	assert.Equal(t, &messages.GroupPausedError{Group: "g", Key: "k1"}, a.paused)

	a = d.admit(keyed("a", "g", 1, "k1"), now, false)
	assert.True(t, a.ok)
	assert.Equal(t, "g", a.resumed)
	assert.Empty(t, d.pausedGroups(now))
	require.True(t, d.admit(keyed("a", "g", 2, "k2"), now, false).ok)
	next := finishNow(d, r.next)
	require.NotNil(t, next)
	assert.Equal(t, []string{"a/g/1"}, refs(next.entries), "the retry goes first")
}

// A retry that reached the queue before the failed request's end keeps its
// place: only the entries ahead of it are taken out, and nothing pauses.
func TestStrictRetryAlreadyQueuedGoesFirst(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2"), keyed("a", "g", 1, "k1"), keyed("a", "g", 3, "k3")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	r := d.finishWith(f, now, outcome{failures: []groupFailure{{group: "g", key: "k1"}}})
	assert.Equal(t, []string{"a/g/2"}, heldRefs(r.held))
	assert.Empty(t, r.paused)
	assert.Empty(t, d.pausedGroups(now))
	require.NotNil(t, r.next)
	assert.Equal(t, []string{"a/g/1"}, refs(r.next.entries))
	checkCounts(t, d.q)
}

// A pause ends by itself after GroupPauseMax, or on ResumeGroup; a failed
// entry without a key is resumed only those ways.
func TestStrictPauseEndsAtGroupPauseMaxOrOnResume(t *testing.T) {
	s := strictSettings()
	d := handoffDispatch(s)
	now := int64(1000)
	q := d.q
	_, paused := q.pauseGroup(groupFailure{group: "g"}, now)
	require.True(t, paused)
	_, paused = q.pauseGroup(groupFailure{group: "h", key: "kh"}, now+5)
	require.True(t, paused)
	assert.Equal(t, now+s.pauseMax, q.wake(), "the actor wakes when the first pause runs out")
	e := keyed("a", "g", 1, "")
	err, _ := q.checkPaused(e, now+1)
	assert.Equal(t, &messages.GroupPausedError{Group: "g"}, err, "no key: a delivery without one does not resume")
	assert.Empty(t, q.expirePauses(now+s.pauseMax-1))
	assert.Equal(t, []string{"g"}, q.expirePauses(now+s.pauseMax))
	assert.Equal(t, []string{"h"}, d.pausedGroups(now+s.pauseMax))
	assert.True(t, d.resumeGroup("h"))
	assert.False(t, d.resumeGroup("h"))
	assert.Empty(t, d.pausedGroups(now))
}

// A pause survives a restart: the crashed incarnation's paused groups are
// copied to the next.
func TestStrictPausesCloneForTheNextIncarnation(t *testing.T) {
	q := newQueue(strictSettings())
	q.pauseGroup(groupFailure{group: "g", key: "k"}, 0)
	c := q.paused.clone()
	q.resume("g")
	assert.Equal(t, pause{key: "k", until: q.s.pauseMax}, c.m["g"])
	assert.Equal(t, int64(math.MaxInt64), pauses{}.clone().minUntil)
}

// learn pauses only for retryable failures, once per group, keyed by the
// group's first failed entry in the request; throttling and deadlines are
// back pressure.
func TestLearnFindsEachGroupsFirstRetryableFailure(t *testing.T) {
	b := &Batcher{p: &Params{Tuning: codec.Tuning{StrictGroups: true}}}
	retry := &codec.EntryError{Code: "InternalError"}
	perm := &codec.EntryError{Code: "InvalidMessageContents", Permanent: true}
	throttled := &codec.EntryError{Code: "ThrottlingException", Throttled: true}
	msgs := []codec.Message{
		{Group: "g", IdempotencyKey: "g1"}, {Group: "p", IdempotencyKey: "p1"}, {Group: "g", IdempotencyKey: "g2"},
		{Group: "", IdempotencyKey: "u"}, {Group: "t", IdempotencyKey: "t1"}, {Group: "g", IdempotencyKey: "g3"},
	}
	res := []codec.Result{{ID: "1"}, {Err: perm}, {Err: retry}, {Err: retry}, {Err: throttled}, {Err: retry}}
	o := b.learn(msgs, res, nil, time.Millisecond)
	assert.Equal(t, []groupFailure{{group: "g", key: "g2"}, {group: "t", key: "t1"}}, o.failures)
	assert.True(t, o.ok)
	assert.True(t, o.pressured)

	o = b.learn(msgs[:1], []codec.Result{{Err: context.DeadlineExceeded}}, context.DeadlineExceeded, time.Second)
	assert.False(t, o.ok)
	assert.True(t, o.pressured)
	assert.Equal(t, []groupFailure{{group: "g", key: "g1"}}, o.failures)

	b.p.Tuning.StrictGroups = false
	assert.Empty(t, b.learn(msgs, res, nil, 0).failures, "without StrictGroups nothing pauses")
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

// A delivery waits behind its tenant's waiters though it fits, and a
// group's waiters are admitted in their order across tenants.
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
	// c fits, but a new delivery of g waits behind g's waiters.
	_, ok := q.admit(mk("c", "", 1, 1), now)
	assert.True(t, ok)
	_, ok = q.admit(mk("c", "g", 3, 1), now)
	assert.False(t, ok)
	q.s.tenantMax = 10
	assert.Empty(t, q.promote(now, everyoneAlive))
	assert.Equal(t, 0, q.waits.n)
	l := q.groups["g"]
	assert.Equal(t, []string{"a/g/1", "b/g/2"}, refs(l.appendLive(nil)))
	checkCounts(t, q)
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
	assert.Empty(t, q.sweepWaiters(49, everyoneAlive))
	assert.Equal(t, []*entry{e}, q.sweepWaiters(50, everyoneAlive))
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

// A paused group's waiters are taken out with its queued entries.
func TestStrictPauseTakesOutWaiters(t *testing.T) {
	s := strictSettings()
	s.block, s.queueMax = true, 2
	d := handoffDispatch(s)
	now := int64(0)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now) // g/1; g/2 stays, gated
	require.True(t, d.admit(keyed("a", "g", 3, "k3"), now, false).ok)
	require.True(t, d.admit(keyed("a", "g", 4, "k4"), now, false).waiting)
	r := d.finishWith(f, now, outcome{failures: []groupFailure{{group: "g", key: "k1"}}})
	assert.Equal(t, []string{"a/g/2", "a/g/3", "a/g/4"}, heldRefs(r.held))
	assert.Equal(t, 0, d.q.waits.n)
	assert.Equal(t, 0, d.q.queued)
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
	r := d.finishWith(f, clock(), outcome{rtt: int64(time.Millisecond), ok: true})
	require.NotNil(t, r.next)
	r = d.finishWith(r.next, clock()+int64(time.Second), outcome{rtt: int64(time.Millisecond), ok: true})
	assert.Equal(t, 2, d.q.s.maxInflight, "a window later with the limit reached: 2")
	assert.Equal(t, 2, r.limit)
}

// launchAt launches one batch at now.
func launchAt(d *dispatch, now int64) (*inflight, []*entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.launchLocked(now)
}

// A delivery of a group refused because the queue is full pauses the group
// for new deliveries, keyed by the refused message, so that a later one
// that finds room is not stored before its retry; the group's queued
// entries stay.
func TestStrictRefusalPausesNewDeliveries(t *testing.T) {
	s := strictSettings()
	s.queueMax = 1
	d := handoffDispatch(s)
	now := int64(0)
	require.True(t, d.admit(keyed("a", "g", 1, "k1"), now, false).ok)
	a := d.admit(keyed("a", "g", 2, "k2"), now, false)
	require.False(t, a.ok)
	assert.Equal(t, "g", a.pausedRefused)
	a = d.admit(keyed("a", "g", 3, "k3"), now, false)
	assert.Equal(t, &messages.GroupPausedError{Group: "g", Key: "k2"}, a.paused)
	a = d.admit(keyed("a", "g", 2, "k2"), now, false)
	assert.False(t, a.ok, "the retry is refused too: the queue is still full")
	assert.Equal(t, []string{"g"}, d.pausedGroups(now), "and the group stays paused")
	f, _ := launchAt(d, now)
	assert.Equal(t, []string{"a/g/1"}, refs(f.entries), "the queued entry goes")
	a = d.admit(keyed("a", "g", 2, "k2"), now, false)
	assert.True(t, a.ok)
	assert.Equal(t, "g", a.resumed)
}

// A crash pauses every group the incarnation held an entry of, keyed by
// its first (in a request before queued), and the pauses carry over.
func TestStrictCrashPausesHeldGroups(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(0)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2"), keyed("a", "h", 1, "h1")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))
	d.markDown()
	d.pauseHeld(now)
	c := d.pauses()
	assert.Equal(t, "k1", c.m["g"].key)
	assert.Equal(t, "h1", c.m["h"].key)
	next := handoffDispatch(strictSettings())
	next.seedPauses(c)
	assert.Equal(t, []string{"g", "h"}, next.pausedGroups(now))
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
	held, _ := q.pauseGroup(groupFailure{group: "g"}, 0) // takes g/2 out of the middle
	require.Len(t, held, 1)
	assert.Equal(t, []*entry{first}, q.sweepWaiters(10, everyoneAlive))
	assert.Equal(t, 1, q.waits.n)
}

// Pauses move between queues (cluster mode's hand-off): takePauses removes
// the running ones with the time each has left, sorted, and leaves the
// queue with none (it may then stop idle); adoptPauses sets them from the
// taker's now, cut to its GroupPauseMax, keeps a pause the taker had, and
// skips a pause with no time left or no group. The adopted group is held
// until its key comes, and the adopted pause wakes the actor when it ends.
func TestStrictPausesMoveBetweenQueues(t *testing.T) {
	s := strictSettings()
	from := newQueue(s)
	from.pauseGroup(groupFailure{group: "b", key: "kb"}, 0)
	from.pauseGroup(groupFailure{group: "a", key: "ka"}, 10)
	from.pauseGroup(groupFailure{group: "gone"}, -s.pauseMax)
	taken := from.takePauses(100)
	assert.Equal(t, []messages.PausedGroup{
		{Group: "a", Key: "ka", Left: time.Duration(s.pauseMax - 90)},
		{Group: "b", Key: "kb", Left: time.Duration(s.pauseMax - 100)},
	}, taken, "sorted, each with its time left; the one that ran out stays behind")
	assert.Empty(t, from.pausedGroups())
	assert.Equal(t, int64(math.MaxInt64), from.paused.minUntil)
	assert.Nil(t, from.takePauses(100), "nothing is taken twice")

	to := newQueue(s)
	to.pauseGroup(groupFailure{group: "b", key: "own"}, 5000)
	to.adoptPauses(append(taken,
		messages.PausedGroup{Group: "long", Key: "kl", Left: time.Duration(10 * s.pauseMax)},
		messages.PausedGroup{Group: "spent", Key: "ks"},
		messages.PausedGroup{Key: "nogroup", Left: time.Second},
	), 5000)
	assert.Equal(t, []string{"a", "b", "long"}, to.pausedGroups())
	assert.Equal(t, pause{key: "ka", until: 5000 + s.pauseMax - 90}, to.paused.m["a"])
	assert.Equal(t, pause{key: "own", until: 5000 + s.pauseMax}, to.paused.m["b"], "the taker's own pause is kept")
	assert.Equal(t, pause{key: "kl", until: 5000 + s.pauseMax}, to.paused.m["long"], "cut to GroupPauseMax")
	assert.Equal(t, 5000+s.pauseMax-90, to.wake())
	err, _ := to.checkPaused(keyed("x", "a", 1, "other"), 5001)
	assert.Equal(t, &messages.GroupPausedError{Group: "a", Key: "ka"}, err)
	err, resumed := to.checkPaused(keyed("x", "a", 1, "ka"), 5001)
	assert.Nil(t, err)
	assert.True(t, resumed, "the failed message's retry resumes the adopted pause")
}

// A destination without StrictGroups adopts no pause: its deliveries are
// never answered GroupPausedError.
func TestAdoptPausesNeedsStrictGroups(t *testing.T) {
	q := newQueue(testSettings())
	q.adoptPauses([]messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}}, 0)
	assert.Empty(t, q.pausedGroups())
	err, _ := q.checkPaused(keyed("a", "g", 1, ""), 1)
	assert.Nil(t, err)
}
