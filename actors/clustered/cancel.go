package clustered

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
)

// This file is how a caller's cancellation reaches its delivery's owner. A
// caller on another member whose ctx is cancelled (not its deadline, which
// travels with the delivery) after its delivery was written sends the
// delivery's grain a DeliverBatch carrying only its CancelDelivery (a field
// members of earlier versions skip); the owner keeps it in its cancels, and
// the owner's batcher, which asks a delivery's record whether its caller
// still listens before it queues it and before it sends it, drops it unsent
// and tells the record (Forgotten), which the ledger then counts as
// answered. A delivery the batcher already sent is answered as usual, to a
// caller that no longer waits. A caller on the owner itself that admitted
// directly needs no message: its record reads the caller's call
// (admitted.Listening).
//
// Deliveries cost nothing here: a record looks at the cancels only when
// there are some.

// callKey names a delivery: the process of its caller (its address and
// id: the caller node's own, see incarnationID) and its call there.
type callKey struct {
	address, id string
	call        uint32
}

// cancels are the deliveries whose callers cancelled, each kept until its
// record is answered or forgotten, or its caller's deadline (plus
// cancelSlack) has passed: a cancel may come after its delivery's answer
// left. Safe for concurrent use.
type cancels struct {
	n     atomic.Int64 // len(m), stored under mu: 0, and nobody need lock mu
	mu    sync.Mutex
	m     map[callKey]time.Time // until when; guarded by mu
	swept time.Time             // when add last forgot the expired; guarded by mu
}

// cancelSlack is how long past its caller's deadline a cancel is kept: the
// owner's deadline of the delivery is the caller's plus its batch's
// transit.
const cancelSlack = time.Second

// add keeps the cancel of k until until, and forgets those kept past
// theirs (at most once a second).
func (cs *cancels) add(k callKey, until, now time.Time) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[callKey]time.Time{}
	}
	if now.Sub(cs.swept) >= time.Second {
		cs.swept = now
		for k, t := range cs.m {
			if now.After(t) {
				delete(cs.m, k)
			}
		}
	}
	cs.m[k] = until
	cs.n.Store(int64(len(cs.m)))
}

// has reports whether k's caller cancelled.
func (cs *cancels) has(k callKey) bool {
	if cs.n.Load() == 0 {
		return false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	_, ok := cs.m[k]
	return ok
}

// done forgets the cancel of k, if any: its record was answered or
// forgotten.
func (cs *cancels) done(k callKey) {
	if cs.n.Load() == 0 {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.m, k)
	cs.n.Store(int64(len(cs.m)))
}

// cancelDelivery tells grain that the caller of call, who would have
// waited until deadline, cancelled.
func (n *Node) cancelDelivery(grain *actor.PID, call uint32, deadline time.Time) {
	n.system.Root.RequestWithCustomSender(grain, &clusterpb.DeliverBatch{
		Cancels: []*clusterpb.CancelDelivery{{Call: call, BudgetNanos: int64(time.Until(deadline))}},
	}, n.answersTo())
}

// cancel takes the cancels of a DeliverBatch from sender's member and
// keeps them for the deliveries' records to find: those admitted already,
// and those still buffered, once admitted.
func (g *grain) cancel(sender *actor.PID, cancels []*clusterpb.CancelDelivery) {
	if sender == nil {
		return
	}
	now := time.Now()
	for _, m := range cancels {
		if m != nil {
			g.n.cancels.add(callKey{sender.Address, sender.Id, m.Call}, now.Add(time.Duration(m.BudgetNanos)+cancelSlack), now)
		}
	}
}
