package adversary_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// This file is the round's listening callers: each call's sender is a reply
// process of its own, registered in the actor system, that is a
// batcher.Listener (it has Listening and Answer), as a caller's pooled reply
// process may be. A batcher asks it whether its caller still waits when it
// sweeps the queue or takes the entry into a batch, on the actor or on a
// request goroutine, with its lock held; now and then Listening panics, as
// the caller's code may (feature listenpanic; see askedFrom). Each such panic restarts the destination's batcher (at most
// once), and every caller is still answered exactly once.

// listening is the round's listening callers: the chance that a Listening
// panics, and what they registered and raised.
type listening struct {
	p float64

	mu   sync.Mutex
	rng  *rand.Rand
	pids []*actor.PID

	panics atomic.Int64
}

// drawListening draws the round's listening callers, from a stream of its
// own so that the rest of a seed's configuration is what it was before
// they existed: none in half the rounds.
func (r *round) drawListening() int {
	rng := rand.New(rand.NewPCG(r.seed, 3))
	if !r.on("listenpanic") || rng.IntN(2) == 0 {
		return 0
	}
	r.listen = &listening{
		p:   []float64{0.001, 0.01, 0.05}[rng.IntN(3)],
		rng: rand.New(rand.NewPCG(r.seed, 7000)),
	}
	return 1 + rng.IntN(4)
}

func (l *listening) chance() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64() < l.p
}

// listenProc is one call's reply process.
type listenProc struct {
	r *round
	c *call
}

// Listening says the caller waits, or panics; a panic marks the call's
// destination as crashed from then on (an ErrBatcherDown has a cause). It
// panics in a take on a request goroutine (dispatch.finish) with the
// listenpanic feature, in a take on the actor (dispatch.step) only with
// listenstep too, and in a sweep only with listensweep too.
func (p *listenProc) Listening(*actor.PID) bool {
	if l := p.r.listen; l.chance() && p.r.on(askedFrom()) {
		p.c.d.listenCrash.CompareAndSwap(0, time.Now().UnixNano())
		l.panics.Add(1)
		panic("adversary: Listening panics")
	}
	return true
}

// Answer is never called: the call's Deliver names no Listener in its Ref,
// so the batcher answers with a *messages.Delivered.
func (p *listenProc) Answer(*actor.PID, codec.Result) {
	p.r.violate("listener-answer", "%s: answered with Answer, though its Ref is not a Direct", p.c.describe())
}

func (p *listenProc) SendUserMessage(_ *actor.PID, message any) {
	if m, ok := actor.UnwrapEnvelopeMessage(message).(*messages.Delivered); ok {
		p.r.delivered(m)
	}
}
func (*listenProc) SendSystemMessage(*actor.PID, any) {}
func (*listenProc) Stop(*actor.PID)                   {}

// askedFrom names the feature that lets Listening panic where the batcher
// asks: in a sweep of its queue (listensweep; see
// TestPanicInSweepLosesExpiredEntries), in a take of dispatch.step on the
// actor (listenstep; see TestPanicInLaterTakeLosesDropped), or elsewhere, a
// request goroutine's take in dispatch.finish (listenpanic).
func askedFrom() string {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		switch {
		case strings.HasSuffix(f.Function, "batcher.(*queue).sweep"):
			return "listensweep"
		case strings.HasSuffix(f.Function, "batcher.(*dispatch).step"):
			return "listenstep"
		}
		if !more {
			return "listenpanic"
		}
	}
}

// listenCaller delivers one call at a time, each from a reply process of
// its own, and waits for its answer. The processes stay registered until
// the round ends, so that a second answer still reaches its call.
func (r *round) listenCaller(idx int) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(7100+idx)))
	for !r.trafficEnd.Load() {
		c := r.newCall(rng, "listener", r.dests[rng.IntN(len(r.dests))], "", 0, 0)
		pid, ok := r.system.ProcessRegistry.Add(&listenProc{r: r, c: c}, fmt.Sprintf("adv-listen-%d", c.id))
		if !ok {
			r.violate("listener-registry", "%s: its reply process's name is taken", c.describe())
			return
		}
		r.listen.mu.Lock()
		r.listen.pids = append(r.listen.pids, pid)
		r.listen.mu.Unlock()
		r.system.Root.RequestWithCustomSender(r.inst.PID(), r.deliverMsg(c), pid)
		select {
		case <-c.done:
		case <-r.kill:
			return
		}
		if !r.pause(r.gap(rng)) {
			return
		}
	}
}

// unregisterListeners removes the listening callers' reply processes.
func (r *round) unregisterListeners() {
	if r.listen == nil {
		return
	}
	r.listen.mu.Lock()
	defer r.listen.mu.Unlock()
	for _, pid := range r.listen.pids {
		r.system.ProcessRegistry.Remove(pid)
	}
	r.listen.pids = nil
}
