package batcher

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goroutines reports, for each goroutine running now, whether it is running
// or ready to run (not waiting), by its id ("goroutine 7").
func goroutines() map[string]bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for n == len(buf) {
		buf = make([]byte, 2*len(buf))
		n = runtime.Stack(buf, true)
	}
	all := map[string]bool{}
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		id, state, ok := strings.Cut(head, " [")
		if ok {
			all[id] = strings.HasPrefix(state, "runnable") || strings.HasPrefix(state, "running")
		}
	}
	return all
}

// runners records the goroutines that run a mailbox.
type runners struct {
	mu  sync.Mutex
	ids map[string]bool
}

// wrap returns fn, recording the goroutine that runs it.
func (r *runners) wrap(fn func()) func() {
	return func() {
		buf := make([]byte, 64)
		head, _, _ := strings.Cut(string(buf[:runtime.Stack(buf, false)]), " [")
		r.mu.Lock()
		r.ids[head] = true
		r.mu.Unlock()
		fn()
	}
}

// left reports how many of the goroutines that ran the mailbox are still
// there, and how many of those are not waiting.
func (r *runners) left() (alive, busy int) {
	all := goroutines()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.ids {
		if b, ok := all[id]; ok {
			alive++
			if b {
				busy++
			}
		}
	}
	return alive, busy
}

// protoactor sets a mailbox idle before its run returns (processMessages),
// so a message posted in that tail schedules the mailbox again before the
// goroutine that ran it has come back to wait for the next run. Once the
// batcher holds nothing, no goroutine of its mailbox may stay: a
// destination gone quiet keeps no goroutine for its IdleTimeout.
func TestAMailboxRunThatOverlapsTheLastLeavesNoGoroutineOnceNothingIsHeld(t *testing.T) {
	r := newMailboxRef()
	defer r.close()
	rs := &runners{ids: map[string]bool{}}
	r.held.Store(true)

	inTail, leaveTail := make(chan struct{}), make(chan struct{})
	r.Schedule(rs.wrap(func() { close(inTail); <-leaveTail }))
	<-inTail
	ran := make(chan struct{}, 1)
	r.Schedule(rs.wrap(func() { ran <- struct{}{} })) // posted in the first run's tail
	close(leaveTail)
	<-ran
	require.Eventually(t, func() bool { _, busy := rs.left(); return busy == 0 }, 10*time.Second, time.Millisecond,
		"the mailbox's goroutines wait for the next run while the batcher holds something")

	// The batcher's next run leaves it holding nothing.
	r.Schedule(rs.wrap(func() { r.held.Store(false); ran <- struct{}{} }))
	<-ran
	require.Eventually(t, func() bool { alive, _ := rs.left(); return alive == 0 }, 5*time.Second, time.Millisecond,
		"a batcher that holds nothing keeps no goroutine")
}

// countingInvoker is a mailbox's invoker that counts user messages, catches
// two runs at once, and makes the batcher hold something or nothing as
// each message says.
type countingInvoker struct {
	r       *mailboxRef
	running atomic.Bool
	overlap atomic.Int64
	n       atomic.Int64
}

func (c *countingInvoker) InvokeSystemMessage(any) {}
func (c *countingInvoker) InvokeUserMessage(m any) {
	if !c.running.CompareAndSwap(false, true) {
		c.overlap.Add(1)
	}
	c.r.held.Store(m.(bool))
	c.n.Add(1)
	c.running.Store(false)
}
func (c *countingInvoker) EscalateFailure(any, any) {}

// wrapped is a mailboxRef that records the goroutines its runs go on.
type wrapped struct {
	*mailboxRef
	rs *runners
}

func (w wrapped) Schedule(fn func()) { w.mailboxRef.Schedule(w.rs.wrap(fn)) }

// protoactor's own mailbox, posted to from many goroutines, run by
// mailboxRef while the batcher holds something now and then: every message
// runs once, never two at a time, and once the last run sees the batcher
// hold nothing no goroutine of the mailbox is left.
func TestMailboxRunsEveryMessageOnceOnOneGoroutineAtATime(t *testing.T) {
	r := newMailboxRef()
	defer r.close()
	rs := &runners{ids: map[string]bool{}}
	inv := &countingInvoker{r: r}
	m := actor.UnboundedPriorityMpsc()()
	m.RegisterHandlers(inv, wrapped{r, rs})
	m.Start()
	const posters, each = 8, 5000
	var wg sync.WaitGroup
	for p := range posters {
		wg.Go(func() {
			for i := range each {
				m.PostUserMessage((p+i)%3 != 0)
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return inv.n.Load() == posters*each }, 10*time.Second, time.Millisecond)
	m.PostUserMessage(false) // the batcher holds nothing
	require.Eventually(t, func() bool { return inv.n.Load() == posters*each+1 }, 10*time.Second, time.Millisecond)
	assert.Zero(t, inv.overlap.Load(), "two runs at once")
	require.Eventually(t, func() bool { alive, _ := rs.left(); return alive == 0 }, 5*time.Second, time.Millisecond,
		"a batcher that holds nothing keeps no goroutine")
}
