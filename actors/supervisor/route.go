package supervisor

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
)

// closed is the high bit of route.state: deliveries are held, not sent.
const closed = uint64(1) << 63

// route is one destination as the router sees it. Deliveries reach the
// batcher straight from the caller's goroutine while the route is open; while
// it is closed (no batcher yet, or the batcher stopping idle) they are held
// and handed to the next batcher in order.
//
// state counts the deliveries sent to the current batcher. The batcher counts
// what it received; the supervisor closes the route for an idle stop only with
// a compare-and-swap from exactly that count, so a batcher is never stopped
// while a delivery is on its way to it (protoactor drops such messages
// silently).
type route struct {
	name     string // the destination's actor name: codec kind and keyed digest
	sink     string // codec.Name(), read once, under a recover
	codec    codec.Codec
	tuning   codec.Tuning
	oneGroup bool // Limits().OneGroupPerRequest
	state    atomic.Uint64
	target   atomic.Pointer[target]
	// params are the current batcher's, for ResumeGroup and PausedGroups;
	// nil until the first batcher starts.
	params atomic.Pointer[batcher.Params]

	mu      sync.Mutex
	held    []any // messages waiting for a batcher, in arrival order
	retired bool
	keys    []codec.Codec // codec values cached to this route

	// Touched only by the supervisor actor.
	pid          *actor.PID
	idleStopping bool
	draining     bool
}

type target struct {
	pid  *actor.PID
	proc actor.Process
}

// forward sends message to the route's batcher, or holds it while the route
// is closed. It reports false when the route was retired meanwhile: the
// caller looks the destination up again.
func (rt *route) forward(message any, stopping *atomic.Bool, refuse func()) bool {
	for {
		if rt.state.Add(1)&closed == 0 {
			t := rt.target.Load()
			t.proc.SendUserMessage(t.pid, message)
			return true
		}
		rt.mu.Lock()
		switch {
		case rt.retired:
			rt.mu.Unlock()
			return false
		case rt.state.Load()&closed == 0:
			rt.mu.Unlock()
			continue // reopened while we waited for the lock
		case stopping.Load():
			rt.mu.Unlock()
			refuse()
			return true
		}
		rt.held = append(rt.held, message)
		rt.mu.Unlock()
		return true
	}
}
