package actors

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/mono"
	"github.com/ankusa/sinkbatch/messages"
)

// maxPooledWaiters bounds the reply processes an instance keeps registered
// between calls: the peak of concurrent Deliver calls, up to this many.
const maxPooledWaiters = 1 << 14

// maxSearch bounds the waiters get looks at in waiters.all when the
// sync.Pool is empty.
const maxSearch = 64

// waiter is a reply process for Deliver calls, one call at a time. It stays
// registered between calls, so a call costs no registration; each call is
// told apart by the RequestId of the sender PID it hands out, so an answer
// to an abandoned call is dropped, and a batcher asking Listening learns
// that the call's caller is gone.
type waiter struct {
	id     string
	answer chan codec.Result
	call   atomic.Uint32 // the RequestId of the call waiting; 0: none
	seq    uint32        // the last RequestId handed out; only its caller touches it
	// deadline is when the call waiting gives up, on the mono clock, if
	// its ctx has no deadline (DefaultTimeout); 0: its ctx bounds it.
	deadline atomic.Int64
	// timer ends a call at its deadline (expire). It is armed when a call
	// needs it and left armed across calls: a deadline never comes earlier
	// than the one before, so a call whose timer fires no later than its
	// deadline costs no timer operation, and the caller waits on its answer
	// alone rather than on a timer channel too. armed is when it fires
	// next; 0: not armed.
	timer *time.Timer
	armed atomic.Int64
	// free: no call holds the waiter (it is in the pool, or the pool has
	// dropped it). Whoever turns it from true to false holds it.
	free atomic.Bool
	// pooled: the waiter is in waiters.all; any other is unregistered when
	// its call returns. Set when it is made.
	pooled bool
}

// errNoAnswer is what expire answers a call with: its DefaultTimeout ran
// out first. Deliver turns it into its own error.
var errNoAnswer = errors.New("sinkbatch: no answer within DefaultTimeout")

// bound makes the call begun next give up at deadline d (on the mono
// clock); 0: its ctx bounds it. It must precede begin: expire reads
// the call, then its deadline.
func (w *waiter) bound(d int64) { w.deadline.Store(d) }

// arm makes sure the timer fires no later than the deadline of the call
// begun, if it has one. It runs after begin has published the call: a timer
// that fires meanwhile either finds the call (expire re-arms it for the
// call's deadline) or has stored armed 0 before arm reads it (arm re-arms
// it). Checked before begin, a firing could slip in between: arm would see
// the timer still armed, expire no call, and the call would wait forever.
func (w *waiter) arm() {
	d := w.deadline.Load()
	if d == 0 {
		return
	}
	if a := w.armed.Load(); a == 0 || a > d {
		w.armed.Store(d)
		w.timer.Reset(time.Duration(d - mono.Now()))
	}
}

// expire runs when the timer fires: it answers the call waiting with
// errNoAnswer if its deadline has passed, or arms the timer for that
// deadline. A call that begins meanwhile sees armed at 0 and arms it
// itself (arm).
func (w *waiter) expire() {
	w.armed.Store(0)
	id, d := w.call.Load(), w.deadline.Load()
	if id == 0 || d == 0 {
		return
	}
	if now := mono.Now(); now < d {
		w.armed.Store(d)
		w.timer.Reset(time.Duration(d - now))
		return
	}
	if w.call.CompareAndSwap(id, 0) {
		w.answer <- codec.Result{Err: errNoAnswer}
	}
}

// SendUserMessage takes an answer sent as a *messages.Delivered: by the
// supervisor, or by a batcher that did not get w as its Direct.
func (w *waiter) SendUserMessage(pid *actor.PID, message any) {
	if d, ok := actor.UnwrapEnvelopeMessage(message).(*messages.Delivered); ok {
		w.Answer(pid, codec.Result{ID: d.ID, Sequence: d.Sequence, Err: d.Err})
	}
}

// Answer takes the answer to the call pid was handed out for, if that call
// still waits; it drops any other.
func (w *waiter) Answer(pid *actor.PID, r codec.Result) {
	if pid.RequestId != 0 && w.call.CompareAndSwap(pid.RequestId, 0) {
		w.answer <- r
	}
}

func (w *waiter) SendSystemMessage(*actor.PID, any) {}

func (w *waiter) Stop(*actor.PID) {}

// Listening reports whether the call pid was handed out for still waits for
// its answer. Batchers ask it before sending an entry: an abandoned entry is
// never sent.
func (w *waiter) Listening(pid *actor.PID) bool {
	return pid.RequestId != 0 && w.call.Load() == pid.RequestId
}

// begin starts a call, arms the timer for its deadline if it needs one,
// and fills in pid, the sender PID to hand out.
func (w *waiter) begin(pid *actor.PID, address string) {
	w.seq++
	if w.seq == 0 {
		w.seq = 1
	}
	w.call.Store(w.seq)
	w.arm()
	pid.Address, pid.Id, pid.RequestId = address, w.id, w.seq
}

// abandon ends a call that stopped waiting. If its answer was already on its
// way, it is taken here so that the next call does not read it.
func (w *waiter) abandon(pid *actor.PID) {
	if !w.call.CompareAndSwap(pid.RequestId, 0) {
		<-w.answer
	}
}

// waiters is an instance's pool of registered waiters.
//
// Every call takes a waiter and puts it back, so the pool is a sync.Pool,
// whose per-P caches take no lock: a free list under one mutex, taken twice
// a call by thousands of callers, made them queue and park on it. A
// sync.Pool drops what it holds at collections, and a dropped waiter would
// stay registered for good, so the pool also keeps every waiter it made in
// all (up to maxPooledWaiters) and finds the dropped ones there when the
// sync.Pool runs dry. A waiter's free flag says who holds it: the sync.Pool
// and all can both reach a free waiter, and only the one that clears the
// flag takes it.
type waiters struct {
	system *actor.ActorSystem
	prefix string
	pool   sync.Pool // *waiter, free
	closed atomic.Bool

	mu     sync.Mutex
	all    []*waiter // every pooled waiter, free or held
	cursor int       // where the next search of all starts
}

// get returns a waiter for one call. After close the waiter is a new one,
// not pooled: put unregisters it.
func (p *waiters) get() *waiter {
	if !p.closed.Load() {
		for {
			w, _ := p.pool.Get().(*waiter)
			if w == nil {
				break
			}
			if w.free.CompareAndSwap(true, false) {
				return w
			}
			// Taken from all since it was put: someone else holds it.
		}
	}
	p.mu.Lock()
	if !p.closed.Load() {
		// Waiters the sync.Pool dropped are free in all. The search is
		// bounded, so that a burst of new callers, who find every waiter
		// held, does not cost each a pass over all; the cursor moves on,
		// and the next search goes on from there.
		for range min(len(p.all), maxSearch) {
			w := p.all[p.cursor]
			p.cursor = (p.cursor + 1) % len(p.all)
			if w.free.CompareAndSwap(true, false) {
				p.mu.Unlock()
				return w
			}
		}
	}
	reg := p.system.ProcessRegistry
	w := &waiter{id: p.prefix + reg.NextId(), answer: make(chan codec.Result, 1)}
	w.timer = time.AfterFunc(time.Hour, w.expire)
	w.timer.Stop()
	if !p.closed.Load() && len(p.all) < maxPooledWaiters {
		w.pooled = true
		p.all = append(p.all, w)
	}
	p.mu.Unlock()
	reg.Add(w, w.id)
	return w
}

// put takes back a waiter whose call has returned, or unregisters it if it
// is not pooled or the pool has closed.
func (p *waiters) put(w *waiter) {
	if !w.pooled {
		p.unregister(w)
		return
	}
	w.free.Store(true)
	if !p.closed.Load() {
		p.pool.Put(w)
		return
	}
	// Free before closed is read: a close that this put does not see
	// finds the waiter free and unregisters it; one it sees may have.
	if w.free.CompareAndSwap(true, false) {
		p.unregister(w)
	}
}

// close unregisters the free waiters; a waiter a call holds is unregistered
// when its call returns (put).
func (p *waiters) close() {
	p.closed.Store(true)
	p.mu.Lock()
	all := p.all
	p.all = nil
	p.mu.Unlock()
	for _, w := range all {
		if w.free.CompareAndSwap(true, false) {
			p.unregister(w)
		}
	}
}

// unregister stops w's timer and removes it from the process registry.
func (p *waiters) unregister(w *waiter) {
	w.timer.Stop()
	p.system.ProcessRegistry.Remove(&actor.PID{Id: w.id})
}
