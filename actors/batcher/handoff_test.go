package batcher

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/internal/mono"
)

// handoffDispatch is a dispatch on its own: no actor, no goroutine.
func handoffDispatch(s settings) *dispatch {
	return newDispatch(newQueue(s), &atomic.Int64{})
}

// sweep is sweepGone with no silent caller found gone.
func (d *dispatch) sweep(now int64) []*entry { return d.sweepGone(now, nil) }

// take launches one batch at the clock's time, which finish reads.
func take(d *dispatch) *inflight {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, _ := d.launchLocked(mono.Now())
	return f
}

// finishNow is finish at the clock's time.
func finishNow(d *dispatch, f *inflight) *inflight {
	return d.finishWith(f, mono.Now(), outcome{}).next
}

// A request goroutine whose request ends opens its batch's groups and takes
// the batch due at that moment for its own slot, by the queue's rules: a
// tenant that turned up while the request ran is in it, and a group's next
// entries go only once the group's previous batch is complete.
func TestNextTakesTheBatchDueForItsSlot(t *testing.T) {
	s := testSettings() // 4 entries a batch, 2 in flight
	s.linger = int64(time.Hour)
	b := handoffDispatch(s)
	admitNow(t, b, mk("a", "g", 1, 1), mk("b", "", 1, 1), mk("a", "", 1, 1), mk("b", "", 2, 1))
	f1 := take(b)
	require.NotNil(t, f1)
	assert.ElementsMatch(t, []string{"a/g/1", "b//1", "a//1", "b//2"}, refs(f1.entries))

	// g is gated by f1: with c's entry, 3 are sendable, which is not full.
	admitNow(t, b, mk("a", "g", 2, 1), mk("a", "g", 3, 1), mk("c", "", 1, 1), mk("b", "", 3, 1))
	assert.Nil(t, take(b), "nothing is due while g's request runs")

	f2 := finishNow(b, f1)
	require.NotNil(t, f2, "f1's end opens g, which makes a full batch")
	got := refs(f2.entries)
	assert.ElementsMatch(t, []string{"a/g/2", "a/g/3", "c//1", "b//3"}, got)
	assert.Less(t, slices.Index(got, "a/g/2"), slices.Index(got, "a/g/3"), "a group keeps its order")
	assert.Equal(t, map[*inflight]struct{}{f2: {}}, b.running)
	assert.Equal(t, 1, b.q.inflight, "the slot passed from f1 to f2")

	assert.Nil(t, finishNow(b, f2), "with nothing due the goroutine ends")
	assert.Empty(t, b.running)
	assert.Equal(t, 0, b.q.inflight)
}

// A goroutine takes a slot only when a batch is due: a batch short of
// MaxEntries waits for its linger (the batcher's timer), and while the
// other slots are busy, a goroutine ending never makes more than MaxInflight.
func TestNextKeepsLingerAndMaxInflight(t *testing.T) {
	b := backlogged(t, 12)
	f1, f2 := take(b), take(b)
	require.NotNil(t, f1)
	require.NotNil(t, f2)
	assert.Nil(t, take(b), "two slots, two requests")

	f3 := finishNow(b, f1)
	require.NotNil(t, f3)
	assert.Equal(t, 2, b.q.inflight)
	assert.Nil(t, take(b))

	admitNow(t, b, mk("a", "", 12, 1))
	assert.Nil(t, finishNow(b, f2), "one entry is not a full batch and its linger has not run out")
	assert.Equal(t, 1, b.q.ready)
}

// backlogged is a batcher whose linger never runs out (4 entries a batch,
// 2 in flight), holding n entries of one tenant.
func backlogged(t *testing.T, n int) *dispatch {
	s := testSettings()
	s.linger = int64(time.Hour)
	b := handoffDispatch(s)
	for i := range n {
		admitNow(t, b, mk("a", "", i, 1))
	}
	return b
}

// admitNow admits at the clock's time, which next reads.
func admitNow(t *testing.T, b *dispatch, es ...*entry) {
	t.Helper()
	for _, e := range es {
		_, ok := b.q.admit(e, mono.Now())
		require.True(t, ok, "admit %s", e.to.deliver.Ref)
	}
}

// Once its incarnation is down (Receive or a take panicked, or it is
// restarting or stopping), a request goroutine leaves the queue alone: it
// may be half changed.
func TestNextTakesNothingOnceDown(t *testing.T) {
	b := backlogged(t, 8)
	f := take(b)
	require.NotNil(t, f)
	b.down = true
	assert.Nil(t, finishNow(b, f), "four entries are due, but the batcher is down")
	assert.Contains(t, b.running, f, "its entries are left for the restart to claim and answer")
	assert.Equal(t, 4, b.q.ready)
}

// While request goroutines of a crashed incarnation still run, nothing is
// taken: they may hold slots and groups the new queue knows nothing of.
func TestNothingIsTakenWhileACrashedIncarnationsRequestsRun(t *testing.T) {
	b := backlogged(t, 8)
	b.goroutines.Add(1) // the crashed incarnation's
	assert.Nil(t, take(b))
	b.goroutines.Add(-1)
	assert.NotNil(t, take(b))
}

// A take that panics on a request goroutine ends the goroutine (counted
// once), marks the incarnation down and tells the batcher; nothing is taken
// after it, and the entry it had taken out is still there for the restart
// to answer.
func TestNextThatPanicsLeavesItsTakeForTheRestart(t *testing.T) {
	s := testSettings()
	s.maxInflight = 1
	s.linger = 0
	b := handoffDispatch(s)
	admitNow(t, b, mk("z", "", 1, 1))
	f := take(b)
	require.NotNil(t, f)
	require.Equal(t, 1, b.own)

	// A fault in the rules: b's message is gone by the time the take
	// drops it (its deadline passed) and looks up its group.
	bad := mk("b", "", 1, 1)
	admitNow(t, b, mk("a", "", 1, 1), bad)
	b.q.s.strict = true
	bad.deadline, bad.msg = 1, nil
	r := b.finishWith(f, mono.Now(), outcome{})
	next, panicked := r.next, r.panicked
	assert.Nil(t, next)
	assert.NotNil(t, panicked)
	assert.True(t, b.down)
	assert.Equal(t, 0, b.own)
	assert.Equal(t, int64(0), b.goroutines.Load())

	assert.Nil(t, take(b), "a down incarnation takes nothing")
	assert.ElementsMatch(t, []string{"a//1", "b//1"}, refs(b.abandon(0, false)), "what the restart answers")
}
