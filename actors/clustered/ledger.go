package clustered

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// ledger is a member's owner-side state: for each destination, the grain
// that admits its deliveries here, how many admitted deliveries the local
// instance has not answered yet, and the members waiting for it to hand the
// destination off. A destination's hand-off is done when it has no grain and
// nothing pending; its entry is then deleted. Safe for concurrent use: the
// grains, the endpoint process, the member's callers (admitHere) and Leave
// all call it.
//
// Every delivery is counted in and out, so those two take no lock: pending
// and open are atomic, and admitHere looks the entry up in a copy of the
// map that every change of it replaces. The rest (grain, waiters, the map)
// is guarded by mu. A count of zero settles the entry only if it is
// closed (open is 0): whoever closes it sets open to 0 before it reads
// pending, so a delivery counted in while it was open is seen by the one
// or answered before it.
type ledger struct {
	mu      sync.Mutex
	dests   map[string]*held                 // guarded by mu
	view    atomic.Pointer[map[string]*held] // a copy of dests, for admitHere; replaced under mu
	leaving bool                             // Leave has begun: no grain may register; guarded by mu
	idle    chan struct{}                    // closed once dests is empty after leave; guarded by mu
}

// held is one destination's entry in the ledger.
type held struct {
	destination string       // read-only
	grain       *actor.PID   // the grain admitting or about to admit; nil: none; guarded by ledger.mu
	waiters     []*actor.PID // grains on other members waiting for HandoffDone; guarded by ledger.mu
	pending     atomic.Int64 // admitted deliveries not answered yet, and adoptions in flight; atomic
	// open is the topology version in which the grain, admitting, found
	// that its member owns the destination: while it is the latest, this
	// member's own callers admit directly (admitHere). 0: they may not.
	// Atomic: set under ledger.mu, read without it.
	open atomic.Uint64
	// adopting counts the adoptions of handed-over pauses in flight for
	// the destination (Node.adoptPauses), each also counted in pending so
	// that no hand-off takes the destination's pauses before they are in;
	// adopted are the grains to tell (adopted{}) once it is 0. Guarded by
	// ledger.mu.
	adopting int
	adopted  []*actor.PID
}

// handoff is what a change to the ledger asks its caller to send once the
// lock is released: tell the grain to yield, tell waiters the destination
// is handed off, or tell grains that its pauses are adopted.
type handoff struct {
	destination string
	yield       *actor.PID
	done        []*actor.PID
	adopted     []*actor.PID
}

func newLedger() *ledger {
	l := &ledger{dests: map[string]*held{}}
	l.publish()
	return l
}

// publish replaces the view with a copy of dests. l.mu must be held (or l
// not shared yet).
func (l *ledger) publish() {
	view := make(map[string]*held, len(l.dests))
	for d, h := range l.dests {
		view[d] = h
	}
	l.view.Store(&view)
}

func (l *ledger) entry(destination string) *held {
	h := l.dests[destination]
	if h == nil {
		h = &held{destination: destination}
		l.dests[destination] = h
		l.publish()
	}
	return h
}

// settle deletes h if it is still its destination's entry and has no
// grain and nothing pending, and returns the waiters to answer. l.mu must
// be held.
func (l *ledger) settle(h *held) []*actor.PID {
	if l.dests[h.destination] != h || h.grain != nil || h.pending.Load() > 0 {
		return nil
	}
	delete(l.dests, h.destination)
	l.publish()
	if len(l.dests) == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
	return h.waiters
}

// register makes grain the destination's admitting grain here, replacing
// one that has not unregistered yet, and returns its entry, in which the
// grain counts what it admits. nil: Leave has begun.
func (l *ledger) register(destination string, grain *actor.PID) *held {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leaving {
		return nil
	}
	h := l.entry(destination)
	h.grain = grain
	return h
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
	h.open.Store(0)
	h.adopted = slices.DeleteFunc(h.adopted, grain.Equal)
	return handoff{destination: destination, done: l.settle(h)}
}

// open lets this member's callers admit deliveries to destination directly
// while version is the latest topology: grain, the destination's grain
// here, admits in it. It does nothing once Leave has begun or another
// member asked for the destination.
func (l *ledger) open(destination string, grain *actor.PID, version uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.dests[destination]
	if l.leaving || h == nil || h.grain == nil || !h.grain.Equal(grain) || len(h.waiters) > 0 {
		return
	}
	h.open.Store(version)
}

// admitHere counts in a delivery of this member's own caller, about to be
// handed to the local instance directly, and returns its entry, if the
// destination is open in version, the latest topology the caller saw; nil
// if it is not, with what undoing the count asks for. The count keeps the
// destination from being handed off until the delivery is answered, as
// for one the grain admitted; a hand-off request, the grain yielding or
// Leave close it at once.
func (l *ledger) admitHere(destination string, version uint64) (*held, handoff) {
	h := (*l.view.Load())[destination]
	if h == nil || version == 0 || h.open.Load() != version {
		return nil, handoff{}
	}
	if testHookAdmitHere != nil {
		testHookAdmitHere()
	}
	h.pending.Add(1)
	if h.open.Load() != version {
		// Closed meanwhile: whoever closed it may have read the count
		// before this one was added, and found nothing pending.
		return nil, l.answered(h)
	}
	return h, handoff{}
}

// testHookAdmitHere, if set (by tests only), runs between admitHere's
// check and its count.
var testHookAdmitHere func()

// admit counts in a delivery the grain is about to hand to the local
// instance.
func (l *ledger) admit(h *held) { h.pending.Add(1) }

// answered counts out an admitted delivery the local instance answered.
func (l *ledger) answered(h *held) handoff {
	if h.pending.Add(-1) > 0 || h.open.Load() != 0 {
		return handoff{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return handoff{destination: h.destination, done: l.settle(h)}
}

// request records that the grain waiter, on another member, wants to own
// destination. The local grain, if any, must yield; waiter is answered once
// nothing is held here.
func (l *ledger) request(destination string, waiter *actor.PID) handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.dests[destination]
	if h == nil {
		// Nothing held here: done at once, and the map (whose view every
		// change copies) is left as it is.
		return handoff{destination: destination, done: []*actor.PID{waiter}}
	}
	h.waiters = append(h.waiters, waiter)
	h.open.Store(0)
	return handoff{destination: destination, yield: h.grain, done: l.settle(h)}
}

// adoptBegin counts in an adoption of destination's handed-over pauses,
// about to begin, and returns the entry to count it out of (adoptEnd):
// until then the destination is not handed off, and no grain of it here
// admits (adopting).
func (l *ledger) adoptBegin(destination string) *held {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.entry(destination)
	h.adopting++
	h.pending.Add(1)
	return h
}

// adoptEnd counts out an adoption of h's destination that is over: the
// pauses are in the instance, or on their way there ahead of any delivery
// admitted from now on. Once none is in flight, the grains that wait for
// them are told.
func (l *ledger) adoptEnd(h *held) handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := handoff{destination: h.destination}
	h.adopting--
	if h.adopting == 0 {
		out.adopted, h.adopted = h.adopted, nil
	}
	if h.pending.Add(-1) == 0 && h.open.Load() == 0 {
		out.done = l.settle(h)
	}
	return out
}

// adopting reports whether an adoption of destination's pauses is in
// flight; if so, grain is told (adopted{}) once none is.
func (l *ledger) adopting(destination string, grain *actor.PID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.dests[destination]
	if h == nil || h.adopting == 0 {
		return false
	}
	if !slices.ContainsFunc(h.adopted, grain.Equal) {
		h.adopted = append(h.adopted, grain)
	}
	return true
}

// grains are the destinations' grains registered here.
func (l *ledger) grains() []*actor.PID {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*actor.PID
	for _, h := range l.dests {
		if h.grain != nil {
			out = append(out, h.grain)
		}
	}
	return out
}

// leave stops new registrations and returns the grains to tell to yield
// and a channel closed once nothing is held.
func (l *ledger) leave() ([]*actor.PID, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaving = true
	var grains []*actor.PID
	for _, h := range l.dests {
		h.open.Store(0)
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

// abandon forgets everything held, for a Leave whose ctx ended: nothing
// will answer it any more.
func (l *ledger) abandon() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dests = map[string]*held{}
	l.publish()
	if l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}
