package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// maxPooledWaiters bounds the reply processes an instance keeps registered
// between calls: the peak of concurrent Deliver calls, up to this many.
const maxPooledWaiters = 1 << 14

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
	// timer is DefaultTimeout for calls whose ctx has no deadline; only its
	// caller touches it. Reused from call to call, so a call allocates none.
	timer *time.Timer
}

// after arms w's timer for d and returns its channel.
func (w *waiter) after(d time.Duration) <-chan time.Time {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	return w.timer.C
}

// disarm stops the timer after armed, if any. Draining a tick that fired
// meanwhile keeps the next call safe even with GODEBUG=asynctimerchan=1,
// where a stopped timer's channel may still hold one.
func (w *waiter) disarm() {
	if w.timer != nil && !w.timer.Stop() {
		select {
		case <-w.timer.C:
		default:
		}
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

// begin starts a call and fills in pid, the sender PID to hand out.
func (w *waiter) begin(pid *actor.PID, address string) {
	w.seq++
	if w.seq == 0 {
		w.seq = 1
	}
	w.call.Store(w.seq)
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
type waiters struct {
	system *actor.ActorSystem
	prefix string
	mu     sync.Mutex
	free   []*waiter
	closed bool
}

func (p *waiters) get() *waiter {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		w := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return w
	}
	p.mu.Unlock()
	reg := p.system.ProcessRegistry
	w := &waiter{id: p.prefix + reg.NextId(), answer: make(chan codec.Result, 1)}
	reg.Add(w, w.id)
	return w
}

func (p *waiters) put(w *waiter) {
	p.mu.Lock()
	if !p.closed && len(p.free) < maxPooledWaiters {
		p.free = append(p.free, w)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.system.ProcessRegistry.Remove(&actor.PID{Id: w.id})
}

// close unregisters the pooled waiters; waiters in use unregister when
// their call returns.
func (p *waiters) close() {
	p.mu.Lock()
	free := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	for _, w := range free {
		p.system.ProcessRegistry.Remove(&actor.PID{Id: w.id})
	}
}
