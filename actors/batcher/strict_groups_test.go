package batcher

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// failing is the outcome of f's request in which the entries keyed keys
// failed retryably and the others succeeded.
func failing(f *inflight, keys ...string) outcome {
	res := make([]codec.Result, len(f.entries))
	for i, e := range f.entries {
		for _, k := range keys {
			if e.msg.IdempotencyKey == k {
				res[i].Err = &codec.EntryError{Code: "InternalError"}
			}
		}
	}
	return outcome{results: res}
}

// waitsFor lists the keys group g waits for, in order.
func waitsFor(q *queue, g string) []string {
	var out []string
	for _, k := range q.paused.m[g].keys {
		out = append(out, k.key)
	}
	return out
}

// heldBy lists the held entries' refs and the key each was told to wait for.
func heldBy(es []*entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.to.deliver.Ref.(string) + "<" + e.heldBy
	}
	return out
}

// admitKeyed admits a delivery of tenant a, group g, body n, key k at now.
func admitKeyed(d *dispatch, g string, n int, k string, now int64) admission {
	return d.admit(keyed("a", g, n, k), now, false)
}

// A retryable failure of g/1 pauses g before its gate opens: g's queued
// followers are taken out and answered GroupPausedError naming g/1's key;
// the group then admits the retries in the order it first delivered them,
// and nothing else until the last of them is in.
func TestStrictFailurePausesTheGroupUntilItsRetriesAreIn(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2"), keyed("b", "g", 3, "k3"), keyed("a", "h", 1, "h1")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))
	r := d.finishWith(f, now, failing(f, "k1"))
	assert.Equal(t, []string{"a/g/2<k1", "b/g/3<k1"}, heldBy(r.held))
	assert.Equal(t, []string{"g"}, r.paused)
	assert.Equal(t, []bool{true}, r.won, "the goroutine answers g/1")
	require.NotNil(t, r.next, "other groups go on")
	assert.Equal(t, []string{"a/h/1"}, refs(r.next.entries))
	assert.Equal(t, []string{"k1", "k2", "k3"}, waitsFor(d.q, "g"))
	checkCounts(t, d.q)

	a := admitKeyed(d, "g", 4, "k4", now)
	require.True(t, a.paused)
	assert.Equal(t, "k1", a.waitFor, "a new delivery waits for the first retry")
	assert.Equal(t, []string{"k1", "k2", "k3", "k4"}, waitsFor(d.q, "g"), "and its own retry is waited for, last")
	a = admitKeyed(d, "g", 2, "k2", now)
	require.True(t, a.paused, "k2's retry may not overtake k1's")
	assert.Equal(t, "k1", a.waitFor)
	assert.Equal(t, []string{"k1", "k2", "k3", "k4"}, waitsFor(d.q, "g"), "k2 keeps its place")

	for i, k := range []string{"k1", "k2", "k3", "k4"} {
		a = admitKeyed(d, "g", i+1, k, now)
		require.True(t, a.ok, k)
		if k != "k4" {
			assert.Empty(t, a.resumed, "g still waits after %s", k)
		}
	}
	assert.Equal(t, "g", a.resumed)
	assert.Empty(t, d.pausedGroups(now))
	var sent []string
	for f := finishNow(d, r.next); f != nil; f = finishNow(d, f) {
		sent = append(sent, refs(f.entries)...)
	}
	assert.Equal(t, []string{"a/g/1", "a/g/2", "a/g/3", "a/g/4"}, sent, "the retries go first, in order")
}

// The first of the attacks on group order: A is in a slow request, B is
// queued behind it, A's deadline passes and its caller retries at once (A′),
// C arrives, then A's request fails. A's expiry pauses the group with B
// held, A′ is admitted as the retry it waits for, C waits for B's retry, and
// A's late failure, whose caller was answered already, changes nothing.
func TestStrictRetryBeforeTheFailureIsHandledKeepsOrder(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	a := keyed("a", "g", 1, "A")
	a.deadline = now + 150
	require.True(t, d.admit(a, now, false).ok)
	require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))

	now += 150
	late, held := d.expire(now)
	assert.Equal(t, []string{"a/g/1"}, refs(late))
	assert.Equal(t, []string{"a/g/2<A"}, heldBy(held))
	require.True(t, admitKeyed(d, "g", 1, "A", now).ok, "A′")
	c := admitKeyed(d, "g", 3, "C", now)
	require.True(t, c.paused, "C may not overtake B's retry")
	assert.Equal(t, "B", c.waitFor)

	r := d.finishWith(f, now, failing(f, "A"))
	assert.Equal(t, []bool{false}, r.won, "A was answered at its deadline")
	assert.Empty(t, r.held)
	assert.Equal(t, []string{"B", "C"}, waitsFor(d.q, "g"))
	require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
	require.True(t, admitKeyed(d, "g", 3, "C", now).ok)
	var sent []string
	for f := r.next; f != nil; f = finishNow(d, f) {
		sent = append(sent, refs(f.entries)...)
	}
	assert.Equal(t, []string{"a/g/1", "a/g/2", "a/g/3"}, sent)
}

// A retry that another caller queued before the failed request ended (two
// relays share a row) is held with the rest: the group waits for the
// failed key once, in its first place.
func TestStrictRetryQueuedBehindAFollowerIsHeld(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "g", 1, "A"), keyed("a", "g", 2, "B"), keyed("b", "g", 1, "A")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	r := d.finishWith(f, now, failing(f, "A"))
	assert.Equal(t, []string{"a/g/2<A", "b/g/1<A"}, heldBy(r.held))
	assert.Equal(t, []string{"A", "B"}, waitsFor(d.q, "g"))
}

// The third attack: A waits behind P's request and expires in the queue; B
// is queued behind A. The sweep (or a take that finds A at the head) pauses
// the group keyed A with B held, so B cannot leave before A's retry.
func TestStrictExpiryInTheQueuePausesTheGroup(t *testing.T) {
	for _, by := range []string{"sweep", "take"} {
		t.Run(by, func(t *testing.T) {
			d := handoffDispatch(strictSettings())
			now := int64(1000)
			require.True(t, admitKeyed(d, "g", 0, "P", now).ok)
			a := keyed("a", "g", 1, "A")
			a.deadline = now + 10
			require.True(t, d.admit(a, now, false).ok)
			require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
			p, _ := launchAt(d, now)
			require.Equal(t, []string{"a/g/0"}, refs(p.entries))
			now += 10
			var dropped []*entry
			var next *inflight
			if by == "sweep" {
				dropped = d.sweep(now)
				r := d.finishWith(p, now, outcome{})
				next = r.next
			} else {
				r := d.finishWith(p, now, outcome{})
				dropped, next = r.dropped, r.next
			}
			assert.Equal(t, []string{"a/g/1<", "a/g/2<A"}, heldBy(dropped), "A is answered expired, B held")
			assert.Nil(t, next, "nothing of g may leave")
			assert.Equal(t, []string{"A", "B"}, waitsFor(d.q, "g"))
			checkCounts(t, d.q)
		})
	}
}

// The second attack: A's request is in flight and its caller was answered at
// its deadline; B is queued; the batcher restarts. The group waits for A's
// retry first, then B's, not B's first.
func TestStrictRestartKeepsTheFirstDeliveredKeyFirst(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	a := keyed("a", "g", 1, "A")
	a.deadline = now + 10
	require.True(t, d.admit(a, now, false).ok)
	require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
	require.True(t, admitKeyed(d, "h", 1, "H1", now).ok)
	require.True(t, admitKeyed(d, "h", 2, "H2", now).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))
	g, _ := launchAt(d, now)
	require.Equal(t, []string{"a/h/1"}, refs(g.entries))
	d.expire(now + 10)
	d.markDown()
	all := d.abandon(now+10, true)
	assert.ElementsMatch(t, []string{"a/h/1", "a/h/2"}, refs(all), "B was held at A's expiry")
	next := handoffDispatch(strictSettings())
	d.handPausesTo(next, func() {})
	assert.Equal(t, []string{"A", "B"}, waitsFor(next.q, "g"))
	assert.Equal(t, []string{"H1", "H2"}, waitsFor(next.q, "h"), "every entry a restart answers is waited for, in order")
	b := admitKeyed(next, "g", 2, "B", now)
	require.True(t, b.paused)
	assert.Equal(t, "A", b.waitFor)
	later := keyed("a", "g", 9, "Z")
	require.True(t, next.admit(later, now, false).paused)
	require.True(t, admitKeyed(next, "g", 1, "A", now).ok)
	assert.Less(t, next.q.groups["g"].entries[0].rank, next.q.rank, "ranks go on from the crashed incarnation's")
}

// A retryable failure of an entry whose group has an earlier entry in the
// same request that expired first still waits in first-delivery order.
func TestStrictPausesMergeInFirstDeliveryOrder(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 4
	d := handoffDispatch(s)
	now := int64(1000)
	a := keyed("a", "g", 1, "A")
	a.deadline = now + 10
	require.True(t, d.admit(a, now, false).ok)
	require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1", "a/g/2"}, refs(f.entries))
	require.True(t, admitKeyed(d, "g", 3, "C", now).ok)
	late, held := d.expire(now + 10)
	assert.Equal(t, []string{"a/g/1"}, refs(late))
	assert.Equal(t, []string{"a/g/3<A"}, heldBy(held))
	r := d.finishWith(f, now+20, failing(f, "A", "B"))
	assert.Equal(t, []bool{false, true}, r.won)
	assert.Equal(t, []string{"A", "B", "C"}, waitsFor(d.q, "g"))
}

// A permanent failure pauses nothing: that message never comes back. A
// throttled one is retryable and pauses.
func TestStrictPermanentFailureDoesNotPause(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 2
	d := handoffDispatch(s)
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "p", 1, "P1"), keyed("a", "t", 1, "T1"), keyed("a", "p", 2, "P2"), keyed("a", "t", 2, "T2")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/p/1", "a/t/1"}, refs(f.entries))
	o := outcome{results: []codec.Result{
		{Err: &codec.EntryError{Code: "InvalidMessageContents", Permanent: true}},
		{Err: &codec.EntryError{Code: "ThrottlingException", Throttled: true}},
	}}
	r := d.finishWith(f, now, o)
	assert.Equal(t, []string{"t"}, d.pausedGroups(now))
	assert.Equal(t, []string{"a/t/2<T1"}, heldBy(r.held))
	require.NotNil(t, r.next)
	assert.Equal(t, []string{"a/p/2"}, refs(r.next.entries))
}

// A pause ends by itself GroupPauseMax after the last interruption, or on
// ResumeGroup.
func TestStrictPauseEndsAtGroupPauseMaxOrOnResume(t *testing.T) {
	s := strictSettings()
	d := handoffDispatch(s)
	now := int64(1000)
	q := d.q
	q.interrupt([]*entry{keyed("a", "g", 1, "kg")}, now)
	q.interrupt([]*entry{keyed("a", "h", 1, "kh")}, now+5)
	assert.Equal(t, now+s.pauseMax, q.wake(), "the actor wakes when the first pause runs out")
	assert.Empty(t, q.expirePauses(now+s.pauseMax-1))
	assert.Equal(t, []string{"g"}, q.expirePauses(now+s.pauseMax))
	assert.Equal(t, []string{"h"}, d.pausedGroups(now+s.pauseMax))
	assert.True(t, d.resumeGroup("h"))
	assert.False(t, d.resumeGroup("h"))
	assert.Empty(t, d.pausedGroups(now))
}

// A pause survives a restart: the crashed incarnation's paused groups are
// copied, not shared, to the next.
func TestStrictPausesCloneForTheNextIncarnation(t *testing.T) {
	q := newQueue(strictSettings())
	q.interrupt([]*entry{keyed("a", "g", 1, "k")}, 0)
	c := q.paused.clone()
	q.paused.m["g"].keys[0].key = "changed"
	q.resume("g")
	assert.Equal(t, pause{keys: []waitKey{{"k", 0}}, has: map[string]struct{}{"k": {}}, until: q.s.pauseMax}, c.m["g"])
	assert.Equal(t, int64(math.MaxInt64), pauses{}.clone().minUntil)
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
	r := d.finishWith(f, now, failing(f, "k1"))
	assert.Equal(t, []string{"a/g/2<k1", "a/g/3<k1", "a/g/4<k1"}, heldBy(r.held))
	assert.Equal(t, 0, d.q.waits.n)
	assert.Equal(t, 0, d.q.queued)
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
	assert.Equal(t, []string{"g"}, a.pausedRefused)
	a = d.admit(keyed("a", "g", 3, "k3"), now, false)
	require.True(t, a.paused)
	assert.Equal(t, "k2", a.waitFor)
	a = d.admit(keyed("a", "g", 2, "k2"), now, false)
	assert.False(t, a.ok, "the retry is refused too: the queue is still full")
	assert.Equal(t, []string{"k2", "k3"}, waitsFor(d.q, "g"), "and the group still waits for it, then k3")
	f, _ := launchAt(d, now)
	assert.Equal(t, []string{"a/g/1"}, refs(f.entries), "the queued entry goes")
	a = d.admit(keyed("a", "g", 2, "k2"), now, false)
	assert.True(t, a.ok)
	assert.Empty(t, a.resumed)
	require.NotNil(t, finishNow(d, f), "k2's retry leaves, making room")
	a = d.admit(keyed("a", "g", 3, "k3"), now, false)
	assert.True(t, a.ok)
	assert.Equal(t, "g", a.resumed)
}

// Pauses move between queues (cluster mode's hand-off): takePauses removes
// the running ones with the keys each waits for and the time each has left,
// sorted, and leaves the queue with none; adoptPauses sets them from the
// taker's now, cut to its GroupPauseMax, keeps a pause the taker had, and
// skips a pause with no time left or no group. The adopted group admits the
// same retries in the same order.
func TestStrictPausesMoveBetweenQueues(t *testing.T) {
	s := strictSettings()
	from := newQueue(s)
	from.interrupt([]*entry{keyed("a", "b", 1, "kb")}, 0)
	from.interrupt([]*entry{keyed("a", "a", 1, "ka"), keyed("a", "a", 2, "ka2")}, 10)
	from.interrupt([]*entry{keyed("a", "gone", 1, "kg")}, -s.pauseMax)
	taken := from.takePauses(100)
	assert.Equal(t, []messages.PausedGroup{
		{Group: "a", Key: "ka", Then: []string{"ka2"}, Left: time.Duration(s.pauseMax - 90)},
		{Group: "b", Key: "kb", Left: time.Duration(s.pauseMax - 100)},
	}, taken, "sorted, each with its keys and time left; the one that ran out stays behind")
	assert.Empty(t, from.pausedGroups())
	assert.Equal(t, int64(math.MaxInt64), from.paused.minUntil)
	assert.Nil(t, from.takePauses(100), "nothing is taken twice")

	to := handoffDispatch(s)
	to.q.interrupt([]*entry{keyed("a", "b", 1, "own")}, 5000)
	to.adoptPauses(append(taken,
		messages.PausedGroup{Group: "long", Key: "kl", Left: time.Duration(10 * s.pauseMax)},
		messages.PausedGroup{Group: "spent", Key: "ks"},
		messages.PausedGroup{Key: "nogroup", Left: time.Second},
	), 5000)
	assert.Equal(t, []string{"a", "b", "long"}, to.q.pausedGroups())
	assert.Equal(t, []string{"ka", "ka2"}, waitsFor(to.q, "a"))
	assert.Equal(t, 5000+s.pauseMax-90, to.q.paused.m["a"].until)
	assert.Equal(t, []string{"own"}, waitsFor(to.q, "b"), "the taker's own pause is kept")
	assert.Equal(t, 5000+s.pauseMax, to.q.paused.m["long"].until, "cut to GroupPauseMax")
	assert.Equal(t, 5000+s.pauseMax-90, to.q.wake())
	a := admitKeyed(to, "a", 2, "ka2", 5001)
	require.True(t, a.paused)
	assert.Equal(t, "ka", a.waitFor)
	require.True(t, admitKeyed(to, "a", 1, "ka", 5001).ok)
	a = admitKeyed(to, "a", 2, "ka2", 5001)
	require.True(t, a.ok)
	assert.Equal(t, "a", a.resumed)
}

// A destination without StrictGroups adopts no pause and pauses nothing.
func TestStrictRulesNeedStrictGroups(t *testing.T) {
	d := handoffDispatch(testSettings())
	d.adoptPauses([]messages.PausedGroup{{Group: "g", Key: "k", Left: time.Minute}}, 0)
	held, began := d.q.interrupt([]*entry{keyed("a", "g", 1, "k")}, 0)
	assert.Empty(t, held)
	assert.Empty(t, began)
	assert.Empty(t, d.q.pausedGroups())
	assert.False(t, admitKeyed(d, "g", 1, "", 1).paused)
}

// A retry admitted after the sweep admit runs for room drops an older
// entry of its own group: the group must wait for the dropped entry's
// retry before the retry just admitted (it was delivered first).
func TestStrictSweepDuringARetryKeepsTheOlderEntryFirst(t *testing.T) {
	s := strictSettings()
	s.queueMax = 1
	d := handoffDispatch(s)
	now := int64(1000)
	x := keyed("a", "g", 1, "X")
	x.deadline = now + 100
	require.True(t, d.admit(x, now, false).ok, "X queued")
	a := d.admit(keyed("a", "g", 2, "N"), now, false)
	require.False(t, a.ok, "N refused: the queue is full")
	require.Equal(t, []string{"N"}, waitsFor(d.q, "g"))

	now += 100 // X's deadline passes in the queue
	a = d.admit(keyed("a", "g", 2, "N"), now, false)
	require.Equal(t, []string{"a/g/1"}, refs(a.dropped), "X is swept, its caller answered with an expiry")
	t.Logf("N's retry: ok=%v paused=%v waitFor=%q; g waits for %v", a.ok, a.paused, a.waitFor, waitsFor(d.q, "g"))

	// X's caller retries X at once.
	ax := d.admit(keyed("a", "g", 1, "X"), now, false)
	t.Logf("X's retry: ok=%v paused=%v waitFor=%q; g waits for %v", ax.ok, ax.paused, ax.waitFor, waitsFor(d.q, "g"))

	sent := sendAll(d, now)
	if !a.ok && !a.waiting {
		// N's caller retries what it was answered without a result.
		require.True(t, d.admit(keyed("a", "g", 2, "N"), now, false).ok)
		sent = append(sent, sendAll(d, now)...)
	}
	assert.False(t, ax.paused, "X's retry is the one g waits for first")
	assert.Equal(t, []string{"X", "N"}, sent, "X was delivered before N")
	assert.Empty(t, d.pausedGroups(now), "g is not left waiting for a key whose caller was answered OK")
}

// The same, as it happens most simply: A's request fails, so g waits for A
// then B; A's retry is queued, and its deadline passes in a full queue just
// as B's retry arrives. The sweep for room pauses g again for A, but B's
// admission then consumes A's place in the list: B is stored first, and g
// waits for B (answered OK) while A's next retry is told to wait for it.
func TestStrictRetryExpiringInAFullQueueIsNotOvertakenByTheNextRetry(t *testing.T) {
	for _, block := range []bool{false, true} {
		t.Run(map[bool]string{false: "refuse", true: "block"}[block], func(t *testing.T) {
			s := strictSettings()
			s.queueMax, s.block = 2, block
			d := handoffDispatch(s)
			now := int64(1000)
			require.True(t, admitKeyed(d, "g", 1, "A", now).ok)
			require.True(t, admitKeyed(d, "g", 2, "B", now).ok)
			f, _ := launchAt(d, now)
			r := d.finishWith(f, now, failing(f, "A"))
			require.Equal(t, []string{"A", "B"}, waitsFor(d.q, "g"))
			require.Nil(t, r.next)

			require.True(t, d.admit(mk("o", "", 1, 1), now, false).ok, "another tenant's message")
			a1 := keyed("a", "g", 1, "A")
			a1.deadline = now + 50
			require.True(t, d.admit(a1, now, false).ok, "A's retry")
			require.Equal(t, []string{"B"}, waitsFor(d.q, "g"))

			now += 50
			b := admitKeyed(d, "g", 2, "B", now)
			t.Logf("B's retry: ok=%v waiting=%v paused=%v dropped=%v; g waits for %v", b.ok, b.waiting, b.paused, refs(b.dropped), waitsFor(d.q, "g"))
			a2 := admitKeyed(d, "g", 1, "A", now)
			t.Logf("A's second retry: ok=%v waiting=%v paused=%v waitFor=%q", a2.ok, a2.waiting, a2.paused, a2.waitFor)
			sent := sendAll(d, now)
			if !b.ok && !b.waiting {
				// B's caller retries what it was answered without a result.
				b = admitKeyed(d, "g", 2, "B", now)
				require.True(t, b.ok || b.waiting)
				sent = append(sent, sendAll(d, now)...)
			}
			assert.Equal(t, []string{"A", "B"}, sent, "g's messages are stored in the order g first delivered them")
		})
	}
}

// sendAll sends every batch due at now, each succeeding, and returns the
// keys of group g it stored, in order.
func sendAll(d *dispatch, now int64) []string {
	var sent []string
	f, _ := launchAt(d, now)
	for f != nil {
		for _, e := range f.entries {
			if e.msg.Group == "g" {
				sent = append(sent, e.msg.IdempotencyKey)
			}
		}
		f = d.finishWith(f, now, outcome{}).next
	}
	return sent
}

// (Holds.) With Block, a retry that finds the waiting list full evicts the newest
// waiter of the tenant with the most: when that is an older retry of its
// own group (another tenant's), the eviction pauses g for it again, and
// the new retry's admission must not consume its place.
func TestStrictRetryEvictingAnOlderRetryOfItsGroupDoesNotOvertakeIt(t *testing.T) {
	s := strictSettings()
	s.queueMax, s.block = 2, true
	d := handoffDispatch(s)
	now := int64(1000)
	require.True(t, d.admit(keyed("x", "g", 1, "A"), now, false).ok)
	require.True(t, d.admit(keyed("y", "g", 2, "B"), now, false).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"x/g/1"}, refs(f.entries))
	r := d.finishWith(f, now, failing(f, "A"))
	require.Equal(t, []string{"A", "B"}, waitsFor(d.q, "g"))
	require.Nil(t, r.next)

	require.True(t, d.admit(mk("x", "", 1, 1), now, false).ok)
	require.True(t, d.admit(mk("x", "", 2, 1), now, false).ok, "the queue is full")
	require.True(t, d.admit(mk("x", "", 3, 1), now, false).waiting)
	a := d.admit(keyed("x", "g", 1, "A"), now, false)
	require.True(t, a.waiting, "A's retry waits; the waiting list is full")
	require.Equal(t, []string{"B"}, waitsFor(d.q, "g"))

	b := d.admit(keyed("y", "g", 2, "B"), now, false)
	require.NotNil(t, b.evicted)
	t.Logf("B's retry: waiting=%v paused=%v evicted=%s; g waits for %v", b.waiting, b.paused, b.evicted.to.deliver.Ref, waitsFor(d.q, "g"))
	a2 := d.admit(keyed("x", "g", 1, "A"), now, false)
	t.Logf("A's next retry: ok=%v waiting=%v paused=%v waitFor=%q", a2.ok, a2.waiting, a2.paused, a2.waitFor)
	assert.False(t, a2.paused, "g waits for A's retry first: A was delivered before B")
	assert.Equal(t, "x/g/1", b.evicted.to.deliver.Ref)
	require.Equal(t, []string{"y/g/2"}, refs(b.dropped), "B's retry is held again behind A")
	sent := sendAll(d, now)
	require.True(t, d.admit(keyed("y", "g", 2, "B"), now, false).ok)
	for range 4 {
		sent = append(sent, sendAll(d, now)...)
	}
	assert.Equal(t, []string{"A", "B"}, sent)
}

// A handed-over pause that waits for an empty key (no grouped delivery may
// have one: ErrNoIdempotencyKey) can never be satisfied by a retry: every
// delivery of the group is refused until the time it has left runs out.
// Bad input should be refused at once (AdoptPausedGroups has no error for
// it) or ignored, not turned into a pause no retry can end.
func TestStrictAdoptedPauseWaitingForAnEmptyKeyIsNotAdopted(t *testing.T) {
	d := handoffDispatch(strictSettings())
	now := int64(1000)
	d.adoptPauses([]messages.PausedGroup{{Group: "g", Key: "", Left: time.Minute}, {Group: "h", Key: "h1", Then: []string{""}, Left: time.Minute}}, now)
	t.Logf("paused: %v; g waits for %q, h for %q", d.pausedGroups(now), waitsFor(d.q, "g"), waitsFor(d.q, "h"))
	assert.NotContains(t, d.pausedGroups(now), "g", "g waits for a key no delivery can carry")
	require.True(t, admitKeyed(d, "g", 1, "k1", now).paused == false, "g's next delivery is admitted")
	require.True(t, admitKeyed(d, "h", 1, "h1", now).ok, "h1's retry is admitted")
	assert.False(t, admitKeyed(d, "h", 2, "h2", now).paused, "h then waits for nothing a delivery can carry")
}

// The simplest case: a new delivery of g finds the queue full; the sweep
// for room drops g's older entry X (its deadline passed), which pauses g
// for X's retry, and then admits the new delivery anyway: it was checked
// against g's pause before the sweep. It is stored before X's retry.
func TestStrictDeliveryAdmittedAfterTheSweepPausedItsGroupWaits(t *testing.T) {
	s := strictSettings()
	s.queueMax = 2
	d := handoffDispatch(s)
	now := int64(1000)
	x := keyed("a", "g", 1, "X")
	x.deadline = now + 100
	require.True(t, d.admit(x, now, false).ok)
	require.True(t, d.admit(mk("o", "", 1, 1), now, false).ok, "the queue is full")

	now += 100
	n := admitKeyed(d, "g", 2, "N", now)
	require.Equal(t, []string{"a/g/1"}, refs(n.dropped), "X expired in the queue")
	t.Logf("N: ok=%v paused=%v waitFor=%q; g waits for %v", n.ok, n.paused, n.waitFor, waitsFor(d.q, "g"))
	assert.True(t, n.paused, "g waits for X's retry")
	assert.Equal(t, "X", n.waitFor)
}

// BenchmarkPausedGroupAnswer answers deliveries to a group paused with 0 and
// with 10 000 keys already waited for: each answer adds its key (owe), and
// its cost must not grow with the list (compare the two sub-benchmarks).
func BenchmarkPausedGroupAnswer(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			d := handoffDispatch(strictSettings())
			now := int64(1000)
			keys := []waitKey{{"first", d.q.newRank()}}
			for i := range n {
				keys = append(keys, waitKey{fmt.Sprint("w", i), d.q.newRank()})
			}
			d.q.setPause("g", keys, now, int64(time.Hour))
			es := make([]*entry, b.N)
			for i := range es {
				es[i] = keyed("a", "g", i, fmt.Sprint("k", i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if !d.admit(es[i], now, false).paused {
					b.Fatal("admitted to a paused group")
				}
			}
		})
	}
}

// A caller found gone just before its request (the request goroutine asks,
// outside the lock) is taken out of the batch, unsent; with StrictGroups
// its group pauses, keyed by it, and the group's later entries in the same
// batch are taken out too and held, as its queued ones are. Other groups'
// entries are sent, and an entry the actor already answered (expired in
// flight) stays.
func TestStrictACallerThatLeftBeforeItsRequestHoldsItsGroup(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 10
	d := handoffDispatch(s)
	now := int64(1000)
	es := []*entry{keyed("a", "g", 1, "k1"), keyed("a", "h", 1, "h1"), keyed("b", "g", 2, "k2"), keyed("a", "g", 3, "k3")}
	for _, e := range es {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.ElementsMatch(t, []string{"a/g/1", "a/h/1", "b/g/2", "a/g/3"}, refs(f.entries))
	require.True(t, d.admit(keyed("a", "g", 4, "k4"), now, false).ok, "queued behind g's gate")

	gone := make([]bool, len(f.entries))
	for i, e := range f.entries {
		switch e.msg.IdempotencyKey {
		case "k1":
			gone[i] = true
		case "k3":
			f.claims[i].Store(true) // the actor answered it: expired in flight
		}
	}
	dropped, panicked := d.leave(f, gone, now)
	require.Nil(t, panicked)
	assert.Equal(t, []string{"a/h/1"}, refs(f.entries), "sent: the other group; not g's follower the actor answered already")
	assert.Len(t, f.claims, len(f.entries))
	assert.False(t, f.claims[0].Load())
	assert.ElementsMatch(t, []string{"a/g/1<", "b/g/2<k1", "a/g/4<k1"}, heldBy(dropped), "the gone entry (forgotten) and g's followers (held)")
	assert.Equal(t, []string{"k1", "k2", "k3", "k4"}, waitsFor(d.q, "g"), "k3, answered DeadlineExceeded and not sent, is waited for too")
	a := admitKeyed(d, "g", 2, "k2", now)
	require.True(t, a.paused, "k2 may not overtake k1's retry")
	assert.Equal(t, "k1", a.waitFor)

	// Without StrictGroups only the gone entry is taken out.
	s = testSettings()
	s.linger = 0
	d = handoffDispatch(s)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ = launchAt(d, now)
	require.Equal(t, []string{"a/g/1", "a/g/2"}, refs(f.entries))
	dropped, _ = d.leave(f, []bool{true, false}, now)
	assert.Equal(t, []string{"a/g/2"}, refs(f.entries))
	assert.Equal(t, []string{"a/g/1"}, refs(dropped))
}
