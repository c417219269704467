package batcher

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// This file is the batcher's mailbox and the dispatcher that runs it. Its
// methods run on three kinds of goroutine: protoactor's posting goroutines
// (Schedule, through the mailbox), the mailbox's own goroutine (loop, and
// the run it calls, which is the actor), and any goroutine that wakes the
// actor (tellPrompt: request goroutines, timers). What each touches is
// named beside the field.

// mailboxRef is the mailbox of one spawned batcher, shared by its
// incarnations, and the dispatcher that runs it.
//
// protoactor's default dispatcher starts a goroutine each time a mailbox
// wakes, and a new goroutine's stack is the smallest: a batcher's Receive
// is deep enough to make it grow, and copy, on nearly every wake of a busy
// destination, whose mailbox empties between bursts of callers. Here the
// goroutine that ran the mailbox waits for its next wake instead of ending,
// with its grown stack, while the batcher holds something (queued, waiting
// or in flight: more messages are coming) and until it has stopped (close).
// A batcher that holds nothing lets it end, so that a destination that has
// gone quiet keeps no goroutine for its IdleTimeout.
//
// There is at most one such goroutine: protoactor sets a mailbox idle
// before its run returns, so the next wake can come while the run that
// goroutine is in has yet to end; that wake waits for it (next) instead of
// starting a second goroutine, which would wait on after the first saw the
// batcher hold nothing.
type mailboxRef struct {
	m actor.Mailbox
	// held is what the actor's last advance saw: it holds something. Only
	// the mailbox's goroutine changes it, in a run.
	held atomic.Bool
	// prompt: a done or a tick was posted since the last run started, so
	// the next run starts without yielding (see loop).
	prompt atomic.Bool

	mu      sync.Mutex
	wake    sync.Cond // signalled when next is set or closed
	alive   bool      // a goroutine runs the mailbox, or waits to
	next    func()    // the run handed to it, not yet started
	stopped bool      // the batcher has stopped (close)
}

// newMailboxRef returns the dispatcher of one spawned batcher.
func newMailboxRef() *mailboxRef {
	r := &mailboxRef{}
	r.wake.L = &r.mu
	return r
}

// Schedule hands the mailbox's run to its goroutine, or starts one if there
// is none (the first wake, or the batcher held nothing after the last run).
// protoactor schedules a mailbox only when it is not running, so at most
// one run is handed over at a time.
func (r *mailboxRef) Schedule(fn func()) {
	r.mu.Lock()
	if r.alive {
		r.next = fn
		r.mu.Unlock()
		r.wake.Signal()
		return
	}
	r.alive = true
	r.mu.Unlock()
	go r.loop(fn)
}

// Throughput is protoactor's default: messages run before the goroutine
// yields.
func (*mailboxRef) Throughput() int { return 300 }

// loop runs fn and every run handed to it after, while the batcher holds
// something and until it has stopped. held cannot change while it waits:
// only a run changes it.
//
// A run handed to the waiting goroutine (a busy destination) starts with a
// yield. The sender whose message found the mailbox idle wakes the
// goroutine, and the scheduler runs it next on that sender's P, as soon as
// the sender blocks for its answer; the other senders that are runnable by
// then (a request's answers wake its callers in a burst) would post their
// deliveries after the run has emptied the mailbox, each waking it again.
// Yielding lets them post first, so that one run, and one advance, takes
// the lot: the mailbox stays running (and its senders wake nobody)
// meanwhile. With nothing else runnable the yield returns at once. The
// first run of a new goroutine (a destination that held nothing) and a run
// that a done or a tick may have woken (prompt) start at once: a slot is
// free or a deadline is due, and what the batcher decides then (the next
// batch, an idle report) must not wait for the callers that request has
// just answered.
func (r *mailboxRef) loop(fn func()) {
	r.prompt.Store(false)
	for {
		fn()
		r.mu.Lock()
		for r.next == nil && r.held.Load() && !r.stopped {
			r.wake.Wait()
		}
		fn, r.next = r.next, nil
		if fn == nil {
			r.alive = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if !r.prompt.Swap(false) {
			runtime.Gosched()
		}
	}
}

// close ends the goroutine waiting to run the mailbox: the batcher has
// stopped, and what still reaches its mailbox (protoactor drops it) runs on
// a goroutine that ends with that run.
func (r *mailboxRef) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.wake.Broadcast()
}

// tellPrompt posts msg, a done or a tick, to the batcher self and makes the
// run it wakes start at once (see loop). r is nil in tests that drive a
// Batcher without an actor.
func (r *mailboxRef) tellPrompt(system *actor.ActorSystem, self *actor.PID, msg any) {
	if r != nil {
		r.prompt.Store(true)
	}
	tell(system, self, msg)
}

// pending reports whether user messages wait in the mailbox: each will run
// Receive, so advance may wait for the last of them.
func (r *mailboxRef) pending() bool { return r != nil && r.m != nil && r.m.UserMessageCount() > 0 }
