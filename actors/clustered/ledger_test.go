package clustered

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerHandsOffOnlyWhenDrained: a member answers a hand-off request
// only once its grain has stopped admitting and every delivery it admitted
// has been answered; and forgets the destination then.
func TestLedgerHandsOffOnlyWhenDrained(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	peer := actor.NewPID("b:1", "peer-grain")

	// No grain, nothing pending: done at once.
	h := l.request("idle", peer)
	assert.Nil(t, h.yield)
	assert.Equal(t, []*actor.PID{peer}, h.done)
	assert.Empty(t, l.dests)

	d := l.register("d", grain)
	require.NotNil(t, d)
	l.admit(d)
	l.admit(d)
	h = l.request("d", peer)
	assert.Equal(t, grain, h.yield, "the admitting grain must be told to yield")
	assert.Empty(t, h.done)
	assert.Empty(t, l.unregister("d", actor.NewPID("a:1", "another")).done, "only the registered grain unregisters")
	assert.Empty(t, l.unregister("d", grain).done, "two deliveries are still pending")
	assert.Empty(t, l.answered(d).done)
	h = l.answered(d)
	assert.Equal(t, []*actor.PID{peer}, h.done)
	assert.Equal(t, "d", h.destination)
	assert.Empty(t, l.dests, "a handed-off destination is forgotten")
}

// TestLedgerLeave: Leave's channel closes once nothing is held, and no
// grain registers afterwards.
func TestLedgerLeave(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	d := l.register("d", grain)
	require.NotNil(t, d)
	l.admit(d)
	grains, idle := l.leave()
	assert.Equal(t, []*actor.PID{grain}, grains)
	assert.Nil(t, l.register("e", actor.NewPID("a:1", "late")))
	l.unregister("d", grain)
	select {
	case <-idle:
		t.Fatal("idle with a delivery pending")
	default:
	}
	l.answered(d)
	<-idle

	// Leaving with nothing held is idle at once.
	_, idle = newLedger().leave()
	<-idle
}

// TestCallersClose: close refuses newcomers and waits for those inside.
func TestCallersClose(t *testing.T) {
	var c callers
	require.True(t, c.enter())
	done := c.close()
	assert.False(t, c.enter())
	select {
	case <-done:
		t.Fatal("closed with a caller inside")
	default:
	}
	c.exit()
	<-done
}

// TestLedgerAdmitHereOnlyWhileOpen: a member's own callers admit directly
// only while the grain opened the destination in the topology version
// they saw, and not once another member asked for it, the grain
// unregistered or Leave began; what they admitted holds the hand-off back
// like what the grain admitted.
func TestLedgerAdmitHereOnlyWhileOpen(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	peer := actor.NewPID("b:1", "peer-grain")

	h, _ := l.admitHere("d", 1)
	assert.Nil(t, h, "no entry")
	d := l.register("d", grain)
	require.NotNil(t, d)
	h, _ = l.admitHere("d", 1)
	assert.Nil(t, h, "registered, not opened")
	l.open("d", actor.NewPID("a:1", "another"), 1)
	h, _ = l.admitHere("d", 1)
	assert.Nil(t, h, "only the registered grain opens")
	l.open("d", grain, 1)
	h, _ = l.admitHere("d", 2)
	assert.Nil(t, h, "opened in another topology version")
	h, _ = l.admitHere("d", 0)
	assert.Nil(t, h, "version 0 is closed")
	h, _ = l.admitHere("d", 1)
	require.Same(t, d, h)

	r := l.request("d", peer)
	assert.Equal(t, grain, r.yield)
	after, _ := l.admitHere("d", 1)
	assert.Nil(t, after, "a hand-off request closes the destination at once")
	l.open("d", grain, 1)
	after, _ = l.admitHere("d", 1)
	assert.Nil(t, after, "it stays closed while a member waits")
	assert.Empty(t, l.unregister("d", grain).done, "the delivery admitted directly is pending")
	assert.Equal(t, []*actor.PID{peer}, l.answered(h).done)
	assert.Empty(t, l.dests)

	// Leave closes every destination.
	d = l.register("e", grain)
	l.open("e", grain, 1)
	h, _ = l.admitHere("e", 1)
	require.Same(t, d, h)
	l.answered(h)
	l.leave()
	h, _ = l.admitHere("e", 1)
	assert.Nil(t, h, "Leave closes")
}

// TestLedgerAdmitHereRacingAHandOff: callers admitting directly while
// another member asks for the destination. The hand-off is done (HandoffDone
// is due) only once nothing admitted is unanswered, and nothing is
// admitted after it: otherwise the new owner and this member would both
// send the destination's messages. Run under -race.
func TestLedgerAdmitHereRacingAHandOff(t *testing.T) {
	for round := range 200 {
		l := newLedger()
		grain := actor.NewPID("a:1", "grain")
		d := l.register("d", grain)
		l.open("d", grain, 7)
		var outstanding atomic.Int64 // admitted, not answered
		var handedOff atomic.Bool
		var wrong atomic.Int64
		check := func(h handoff) {
			if len(h.done) == 0 {
				return
			}
			if outstanding.Load() != 0 {
				wrong.Add(1)
			}
			handedOff.Store(true)
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					h, undo := l.admitHere("d", 7)
					check(undo)
					if h == nil {
						continue
					}
					if handedOff.Load() {
						wrong.Add(1) // admitted after the hand-off
					}
					outstanding.Add(1)
					runtime.Gosched()
					outstanding.Add(-1)
					check(l.answered(h))
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.Gosched()
			check(l.request("d", actor.NewPID("b:1", "peer")))
			check(l.unregister("d", grain))
		}()
		wg.Wait()
		require.Zero(t, wrong.Load(), "round %d: handed off with a delivery outstanding, or admitted after", round)
		require.True(t, handedOff.Load(), "round %d: the hand-off must end once everything is answered", round)
		require.Zero(t, d.pending.Load())
	}
}

// TestLedgerAdmitHereClosedBetweenCheckAndCount: the destination is
// closed and handed off between a caller's check and its count. The count
// must be undone: nothing is admitted after the hand-off.
func TestLedgerAdmitHereClosedBetweenCheckAndCount(t *testing.T) {
	l := newLedger()
	grain, peer := actor.NewPID("a:1", "grain"), actor.NewPID("b:1", "peer")
	l.register("d", grain)
	l.open("d", grain, 3)
	var done []*actor.PID
	testHookAdmitHere = func() {
		testHookAdmitHere = nil
		l.request("d", peer)
		done = l.unregister("d", grain).done
	}
	t.Cleanup(func() { testHookAdmitHere = nil })
	h, undo := l.admitHere("d", 3)
	assert.Equal(t, []*actor.PID{peer}, done, "nothing was pending: handed off")
	assert.Nil(t, h, "admitted after the hand-off")
	assert.Empty(t, undo.done, "the hand-off was answered once")
	assert.Empty(t, l.dests)
}
