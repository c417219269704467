package clustered

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// ledger is a member's owner-side state: for each destination, the grain
// that admits its deliveries here, how many admitted deliveries the local
// instance has not answered yet, and the members waiting for it to hand the
// destination off. A destination's hand-off is done when it has no grain and
// nothing pending; its entry is then deleted. Safe for concurrent use: the
// grains, the endpoint process and Leave all call it.
type ledger struct {
	mu      sync.Mutex
	dests   map[string]*held
	leaving bool // Leave has begun: no grain may register
	idle    chan struct{}
}

// held is one destination's entry in the ledger.
type held struct {
	grain   *actor.PID   // the grain admitting or about to admit; nil: none
	pending int          // admitted deliveries not answered yet
	waiters []*actor.PID // grains on other members waiting for HandoffDone
}

// handoff is what a change to the ledger asks its caller to send once the
// lock is released: tell the grain to yield, or tell waiters the
// destination is handed off.
type handoff struct {
	destination string
	yield       *actor.PID
	done        []*actor.PID
}

func newLedger() *ledger { return &ledger{dests: map[string]*held{}} }

func (l *ledger) entry(destination string) *held {
	h := l.dests[destination]
	if h == nil {
		h = &held{}
		l.dests[destination] = h
	}
	return h
}

// settle deletes a destination that has no grain and nothing pending, and
// returns the waiters to answer. l.mu must be held.
func (l *ledger) settle(destination string, h *held) []*actor.PID {
	if h.grain != nil || h.pending > 0 {
		return nil
	}
	delete(l.dests, destination)
	if len(l.dests) == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
	return h.waiters
}

// register makes grain the destination's admitting grain here, replacing
// one that has not unregistered yet. It fails once Leave has begun.
func (l *ledger) register(destination string, grain *actor.PID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leaving {
		return false
	}
	l.entry(destination).grain = grain
	return true
}

// unregister removes grain, if it is still the destination's grain.
func (l *ledger) unregister(destination string, grain *actor.PID) handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.dests[destination]
	if h == nil || h.grain == nil || !h.grain.Equal(grain) {
		return handoff{}
	}
	h.grain = nil
	return handoff{destination: destination, done: l.settle(destination, h)}
}

// admit counts a delivery the grain is about to hand to the local instance.
func (l *ledger) admit(destination string) {
	l.mu.Lock()
	l.entry(destination).pending++
	l.mu.Unlock()
}

// answered counts an admitted delivery the local instance answered.
func (l *ledger) answered(destination string) handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.dests[destination]
	if h == nil {
		return handoff{}
	}
	h.pending--
	return handoff{destination: destination, done: l.settle(destination, h)}
}

// request records that the grain waiter, on another member, wants to own
// destination. The local grain, if any, must yield; waiter is answered once
// nothing is held here.
func (l *ledger) request(destination string, waiter *actor.PID) handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.entry(destination)
	h.waiters = append(h.waiters, waiter)
	return handoff{destination: destination, yield: h.grain, done: l.settle(destination, h)}
}

// leave stops new registrations and returns the grains to tell to yield
// and a channel closed once nothing is held.
func (l *ledger) leave() ([]*actor.PID, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaving = true
	var grains []*actor.PID
	for _, h := range l.dests {
		if h.grain != nil {
			grains = append(grains, h.grain)
		}
	}
	idle := make(chan struct{})
	if len(l.dests) == 0 {
		close(idle)
	} else {
		l.idle = idle
	}
	return grains, idle
}

// isLeaving reports whether Leave has begun.
func (l *ledger) isLeaving() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaving
}

// abandon forgets everything held, for a Leave whose ctx ended: nothing
// will answer it any more.
func (l *ledger) abandon() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dests = map[string]*held{}
	if l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}
