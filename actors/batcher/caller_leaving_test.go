package batcher

import (
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With StrictGroups, a group whose entry's caller left before its request
// was sent stores nothing later of that group before the left entry's
// retry: not even a follower in the same batch whose deadline passed in
// flight (the actor answered it DeadlineExceeded, "may have been stored",
// so leaving it unsent keeps that promise too).
func TestStrictALeftEntryIsNotOvertakenByAFollowerThatExpiredInFlight(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 10
	d := handoffDispatch(s)
	now := int64(1000)
	k1, k2 := keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2")
	k2.deadline = now + 10
	require.True(t, d.admit(k1, now, false).ok)
	require.True(t, d.admit(k2, now, false).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1", "a/g/2"}, refs(f.entries))

	// k2's deadline passes in flight: the actor claims and answers it.
	late, _ := d.expire(now + 10)
	require.Equal(t, []string{"a/g/2"}, refs(late))
	// Then the request goroutine finds k1's caller gone.
	_, panicked := d.leave(f, []bool{true, false}, now+10)
	require.Nil(t, panicked)

	var stored []string
	for _, e := range f.entries {
		stored = append(stored, e.msg.IdempotencyKey)
	}
	d.finishWith(f, now+10, outcome{})
	// Both callers retry, in their own order, with the same keys.
	for _, k := range []struct {
		n   int
		key string
	}{{1, "k1"}, {2, "k2"}} {
		a := admitKeyed(d, "g", k.n, k.key, now+20)
		require.True(t, a.ok, "the retry of %s is admitted", k.key)
	}
	stored = append(stored, sendAll(d, now+20)...)
	assert.Equal(t, []string{"k1", "k2"}, firstDeliveries(stored), "g stored in the order it was first delivered")
}

// firstDeliveries is keys with every key after its first occurrence
// removed.
func firstDeliveries(keys []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// silentKeyed is keyed with a sender and no left flag: an actor's future,
// which the driver asks about outside the lock (admission.ask).
func silentKeyed(tenant, group string, n int, key string) *entry {
	e := keyed(tenant, group, n, key)
	e.to.sender = &actor.PID{Id: fmt.Sprint(tenant, "/", group, "/", n)}
	return e
}

// Between admit, which leaves the silent callers to ask about to the
// driver, and admitSwept, request goroutines run: what they change is
// seen. A failure that paused the delivery's group meanwhile holds it
// (GroupPausedError naming the failed key, and it joins the keys waited
// for); the callers found gone free their room either way; an incarnation
// that went down meanwhile does nothing more.
func TestAnAdmissionLeftToTheDriverSeesWhatChangedMeanwhile(t *testing.T) {
	s := strictSettings()
	s.queueMax = 2
	d := handoffDispatch(s)
	now := int64(1000)
	require.True(t, d.admit(keyed("a", "g", 1, "k1"), now, false).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1"}, refs(f.entries))
	x1, x2 := silentKeyed("b", "h", 1, "x1"), silentKeyed("b", "h", 2, "x2")
	require.True(t, d.admit(x1, now, false).ok)
	require.True(t, d.admit(x2, now, false).ok)

	e := keyed("a", "g", 2, "k2")
	a := d.admit(e, now, true)
	require.False(t, a.ok)
	require.Equal(t, []string{"b/h/1", "b/h/2"}, refs(a.ask), "the queue is full: its silent callers are left to the driver")
	assert.Equal(t, 2, d.q.queued, "nothing was done yet")

	// Meanwhile k1's request fails retryably: g pauses keyed k1, and its
	// goroutine takes x1 for its next request.
	r := d.finishWith(f, now, failing(f, "k1"))
	require.NotNil(t, r.next)
	require.Equal(t, []string{"b/h/1"}, refs(r.next.entries))
	a = d.admitSwept(e, now, a, []*entry{x2})
	assert.True(t, a.paused, "k2 may not overtake k1's retry")
	assert.Equal(t, "k1", a.waitFor)
	assert.False(t, a.ok || a.waiting)
	assert.Equal(t, []string{"b/h/2"}, refs(a.dropped), "x2's caller left: its room is freed")
	assert.Equal(t, []string{"k1", "k2"}, waitsFor(d.q, "g"))
	checkCounts(t, d.q)

	// Down meanwhile: nothing is done, nothing is answered here.
	for _, y := range []*entry{silentKeyed("c", "", 1, "y1"), silentKeyed("c", "", 2, "y2")} {
		require.True(t, d.admit(y, now, false).ok)
	}
	e = keyed("a", "", 3, "n3")
	a = d.admit(e, now, true)
	require.Equal(t, []string{"c//1", "c//2"}, refs(a.ask))
	d.markDown()
	a = d.admitSwept(e, now, a, a.ask)
	assert.Equal(t, admission{down: true}, a)
	assert.Equal(t, 2, d.q.queued, "the restart finds and answers them")
}

// A fault in the rules as a request goroutine takes its batch's gone
// callers out (dispatch.leave) does not end the process: the panic is
// returned, the incarnation is down, and the batch is whole for the
// restart, which answers each of its callers once.
func TestAFaultInTheRulesAsCallersLeaveLeavesTheBatchToTheRestart(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 10
	d := handoffDispatch(s)
	now := int64(1000)
	for _, e := range []*entry{keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2"), keyed("a", "h", 1, "h1")} {
		require.True(t, d.admit(e, now, false).ok)
	}
	f, _ := launchAt(d, now)
	require.Len(t, f.entries, 3)
	before := refs(f.entries)
	gone := make([]bool, 3)
	for i, e := range f.entries {
		gone[i] = e.msg.IdempotencyKey == "k1"
	}
	// The fault: the batch's last entry lost its message by the time its
	// group is looked up, after the gone one was taken out.
	f.entries[2].msg = nil

	var dropped []*entry
	var panicked any
	require.NotPanics(t, func() { dropped, panicked = d.leave(f, gone, now) })
	assert.NotNil(t, panicked)
	assert.Empty(t, dropped, "nothing is answered here")
	assert.True(t, d.down)
	assert.Equal(t, before, refs(f.entries), "the batch is whole")
	assert.Len(t, f.claims, 3)
	assert.ElementsMatch(t, []string{"a/g/1", "a/g/2", "a/h/1"}, refs(d.abandon(now, false)), "what the restart answers")
}

// An entry of a batch that the actor claimed already (it expired in
// flight and was answered) stays in the batch when its own caller is then
// found gone: the request goroutine does not drop it, so it is neither
// answered again nor counted twice.
func TestALeftEntryTheActorClaimedStaysWithItsAnswer(t *testing.T) {
	s := testSettings()
	s.maxEntries, s.linger = 10, 0
	d := handoffDispatch(s)
	now := int64(1000)
	k1, k2 := keyed("a", "", 1, "k1"), keyed("a", "", 2, "k2")
	k1.deadline = now + 10
	require.True(t, d.admit(k1, now, false).ok)
	require.True(t, d.admit(k2, now, false).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a//1", "a//2"}, refs(f.entries))

	late, _ := d.expire(now + 10)
	require.Equal(t, []string{"a//1"}, refs(late), "the actor claims and answers k1")
	dropped, panicked := d.leave(f, []bool{true, true}, now+10)
	require.Nil(t, panicked)
	assert.Equal(t, []string{"a//2"}, refs(dropped), "only the unclaimed entry whose caller left is dropped")
	assert.Equal(t, []string{"a//1"}, refs(f.entries), "the claimed entry stays, answered once by the actor")
}
