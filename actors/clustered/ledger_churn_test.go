package clustered

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
)

// TestCallersCloseUnderChurn: many goroutines enter and exit while
// Leave closes the count. close's channel must close only once every
// caller that entered has exited, never twice (a panic), and no enter
// succeeds after close. Run under -race.
func TestCallersCloseUnderChurn(t *testing.T) {
	for round := range 300 {
		var c callers
		var inside atomic.Int64
		var closed atomic.Bool
		var wrong atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					wasClosed := closed.Load()
					if !c.enter() {
						return // closed: every later enter fails too
					}
					if wasClosed {
						wrong.Add(1) // entered after close returned
					}
					inside.Add(1)
					runtime.Gosched()
					inside.Add(-1)
					c.exit()
				}
			}()
		}
		runtime.Gosched()
		done := c.close()
		closed.Store(true)
		select {
		case <-done:
			if inside.Load() != 0 {
				wrong.Add(1)
			}
		case <-time.After(5 * time.Second):
			close(stop)
			wg.Wait()
			t.Fatalf("round %d: close's channel never closed", round)
		}
		close(stop)
		wg.Wait()
		require.Zero(t, wrong.Load(), "round %d: zero closed with a caller inside, or a caller entered after close", round)
		require.Equal(t, callersClosed, c.state.Load(), "round %d: count must be back to closed+0", round)
	}
}

// TestLedgerRounds: the same destination goes through many rounds
// on one member: a grain registers, opens (in a topology version that
// sometimes moves on under the callers), and is then closed by one of a
// hand-off request from a peer, the grain yielding, or a newer version
// followed by the grain yielding; its own callers admit directly all the
// time. Invariants: a waiter is told HandoffDone exactly once, only when
// nothing admitted is unanswered, and no caller admits between a
// HandoffDone and the next round's open. Run under -race.
func TestLedgerRounds(t *testing.T) {
	l := newLedger()
	var version atomic.Uint64
	version.Store(1)
	var outstanding atomic.Int64 // admitted, not answered
	var openRound atomic.Int64   // round whose door may be open; -1: none may be
	openRound.Store(-1)
	var wrong atomic.Int64
	var mu sync.Mutex
	doneCount := map[string]int{} // waiter → HandoffDones
	var lastDone atomic.Value     // error text of the first violation
	note := func(format string, args ...any) {
		if wrong.Add(1) == 1 {
			lastDone.Store(fmt.Sprintf(format, args...))
		}
	}
	check := func(h handoff) {
		if len(h.done) == 0 {
			return
		}
		if o := outstanding.Load(); o != 0 {
			note("HandoffDone with %d admitted deliveries unanswered", o)
		}
		openRound.Store(-1)
		mu.Lock()
		for _, w := range h.done {
			doneCount[w.Id]++
		}
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				h, undo := l.admitHere("d", version.Load())
				check(undo)
				if h == nil {
					runtime.Gosched()
					continue
				}
				outstanding.Add(1)
				if openRound.Load() < 0 {
					note("admitted while no round is open")
				}
				admitted.Add(1)
				runtime.Gosched()
				outstanding.Add(-1)
				check(l.answered(h))
			}
		}()
	}
	const rounds = 2000
	waiters := 0
	for r := range rounds {
		grain := actor.NewPID("a:1", fmt.Sprintf("grain-%d", r))
		h := l.register("d", grain)
		require.NotNil(t, h)
		if r%5 == 0 {
			version.Add(1)
		}
		openRound.Store(int64(r))
		l.open("d", grain, version.Load())
		runtime.Gosched()
		switch r % 3 {
		case 0: // a peer asks for the destination, then the grain yields
			waiters++
			check(l.request("d", actor.NewPID("b:1", fmt.Sprintf("peer-%d", r))))
			runtime.Gosched()
			check(l.unregister("d", grain))
		case 1: // the grain yields on its own (not the owner any more)
			version.Add(1)
			check(l.unregister("d", grain))
		case 2: // a peer asks while nothing is registered any more
			check(l.unregister("d", grain))
			runtime.Gosched()
			waiters++
			check(l.request("d", actor.NewPID("b:1", fmt.Sprintf("peer-%d", r))))
		}
		// Wait for the round's hand-off (if any) before the next round:
		// the callers answer what they admitted.
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			n := len(doneCount)
			mu.Unlock()
			l.mu.Lock()
			_, held := l.dests["d"]
			l.mu.Unlock()
			if n == waiters && !held {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("round %d: the hand-off never completed (%d of %d waiters told, %d outstanding, pending %v)",
					r, n, waiters, outstanding.Load(), l.dests)
			}
			runtime.Gosched()
		}
		openRound.Store(-1)
	}
	close(stop)
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d violations; first: %v", wrong.Load(), lastDone.Load())
	}
	for w, n := range doneCount {
		require.Equal(t, 1, n, "waiter %s told HandoffDone %d times", w, n)
	}
	t.Logf("%d direct admissions over %d rounds", admitted.Load(), rounds)
}
