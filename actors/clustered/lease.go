package clustered

import (
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
)

// Timing of the ownership lease (see the package doc, Fencing).
const (
	// leaseProbeEvery is how often a node asks every other member whether
	// its member list still holds this member.
	leaseProbeEvery = 100 * time.Millisecond
	// leaseTTL is how long a peer's confirmation counts, from when its
	// probe was sent, on this node's monotonic clock: well under the 2 s
	// after which a member whose health checks fail is dropped, so that a
	// member that cannot hear its peers stops admitting before they can
	// have dropped it.
	leaseTTL = 600 * time.Millisecond
)

// lease is a node's ownership lease: the node admits deliveries, and its
// batchers send what it admitted, only while every other member of its
// member list that takes part in leases confirmed, by answering a probe
// sent less than leaseTTL ago, that its own member list holds this member
// under the same member id. A peer takes part once it answered any probe
// (a member of a version before leases never does, and is not waited
// for). Safe for concurrent use: the probe loop, the endpoint (answers),
// the event-stream subscriber (topologies), grains, callers and batchers
// (holds) all use it.
type lease struct {
	origin time.Time // the monotonic clock's origin for every nanos below; read-only

	// until is the monotonic nanos up to which the lease holds, written
	// under mu and read without it. math.MaxInt64: no peer to wait for.
	until atomic.Int64
	// excluded: a peer's cluster dropped this member for good; the node
	// admits nothing any more (see Node.Excluded).
	excluded atomic.Bool

	mu sync.Mutex
	// peers are the members of the latest member list that take part in
	// leases, by member id. Guarded by mu.
	peers map[string]*leasePeer
	// members are the ids of the latest member list's other members
	// hosting Kind, with their addresses. Guarded by mu.
	members map[string]string
	// firstHeard is when (l.now) a peer first answered a probe; 0: none
	// yet. Guarded by mu.
	firstHeard int64
}

// leasePeer is a peer that takes part in leases. Guarded by lease.mu.
type leasePeer struct {
	address   string
	confirmed int64 // sent_nanos of the latest probe it confirmed; 0: none
	heard     int64 // sent_nanos of the latest probe it answered at all
}

func newLease() *lease {
	l := &lease{origin: time.Now(), peers: map[string]*leasePeer{}, members: map[string]string{}}
	l.until.Store(math.MaxInt64)
	return l
}

// now is the monotonic nanos since l.origin.
func (l *lease) now() int64 { return int64(time.Since(l.origin)) }

// holds reports whether the node may admit and send now.
func (l *lease) holds() bool {
	return !l.excluded.Load() && l.now() < l.until.Load()
}

// recompute sets until from the peers' confirmations. l.mu must be held.
func (l *lease) recompute() {
	until := int64(math.MaxInt64)
	for _, p := range l.peers {
		if p.confirmed == 0 {
			until = 0 // it never confirmed
			break
		}
		until = min(until, p.confirmed+int64(leaseTTL))
	}
	l.until.Store(until)
}

// topology takes the other members hosting Kind of a new member list, by
// id and address: a peer no longer in it is not waited for any more.
func (l *lease) topology(members map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.members = members
	for id, p := range l.peers {
		if addr, ok := members[id]; !ok || addr != p.address {
			delete(l.peers, id)
		}
	}
	l.recompute()
}

// left stops waiting for the member at address, which said it left
// gracefully (Node.onLeft): it admits nothing more, so its confirmation is
// not needed, and it gives none once its actor system stops, which is
// before the member lists drop it; waiting for it would let the lease
// lapse in between. A later member list that still holds it makes it a
// member to probe again.
func (l *lease) left(address string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	members := make(map[string]string, len(l.members))
	for id, a := range l.members {
		if a != address {
			members[id] = a
		}
	}
	// A new map: targets hands the old one out.
	l.members = members
	for id, p := range l.peers {
		if p.address == address {
			delete(l.peers, id)
		}
	}
	l.recompute()
}

// targets are the members to probe: the latest member list's others.
func (l *lease) targets() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.members
}

// answer takes a peer's answer to a probe: from address, about self (this
// member's id). It reports whether the answer excludes this member (the
// first such answer only).
func (l *lease) answer(address, self string, a *clusterpb.LeaseAnswer) (excluded bool) {
	if a.MemberId != self {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var id string
	for mid, addr := range l.members {
		if addr == address {
			id = mid
		}
	}
	if id == "" {
		// Not in this node's member list (yet, or any more).
		return false
	}
	if a.Excluded {
		return l.excluded.CompareAndSwap(false, true)
	}
	p := l.peers[id]
	if p == nil {
		p = &leasePeer{address: address}
		l.peers[id] = p
	}
	if a.SentNanos > l.now() {
		return false // not a probe of this node's
	}
	p.heard = max(p.heard, a.SentNanos)
	if l.firstHeard == 0 {
		l.firstHeard = max(l.now(), 1)
	}
	if a.Includes && a.SentNanos > p.confirmed {
		p.confirmed = a.SentNanos
	}
	l.recompute()
	return false
}

// speaks reports whether the member at address takes part in leases, and
// so knows every message of clusterpb.
func (l *lease) speaks(address string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.peers {
		if p.address == address {
			return true
		}
	}
	return false
}

// heardAnyone returns when (l.now) a peer first answered a probe, and
// false while none has: until then the node cannot tell a
// silent peer from its own connections still being made.
func (l *lease) heardAnyone() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstHeard, l.firstHeard != 0
}

// heardSince reports whether the member at address answered a probe sent
// at or after since (monotonic nanos, see now).
func (l *lease) heardSince(address string, since int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.peers {
		if p.address == address && p.heard >= since {
			return true
		}
	}
	return false
}

// probeLoop probes every other member each leaseProbeEvery until stop is
// closed or the actor system stops. It runs on a goroutine of its own,
// started by Attach.
func (n *Node) probeLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(leaseProbeEvery)
	defer t.Stop()
	for !n.system.IsStopped() {
		n.probe()
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

// probe sends a LeaseProbe to every other member of the latest member list.
func (n *Node) probe() {
	id := n.system.ID
	sender := n.answersTo()
	for _, addr := range n.lease.targets() {
		msg := &clusterpb.DeliverReplies{LeaseProbe: &clusterpb.LeaseProbe{MemberId: id, SentNanos: n.lease.now()}}
		n.system.Root.RequestWithCustomSender(actor.NewPID(addr, endpointID), msg, sender)
	}
}

// onLeaseProbe answers a peer's probe: whether this member's member list
// holds the prober's member at the sender's address, and whether this
// member's cluster dropped it for good.
func (n *Node) onLeaseProbe(sender *actor.PID, p *clusterpb.LeaseProbe) {
	if sender == nil || n.withoutLeases.Load() {
		return
	}
	a := &clusterpb.LeaseAnswer{MemberId: p.MemberId, SentNanos: p.SentNanos, Includes: n.topo.hasMember(p.MemberId, sender.Address)}
	if c := n.cluster.Load(); c != nil && !a.Includes {
		a.Excluded = c.Remote.BlockList().IsBlocked(p.MemberId)
	}
	// Sent from this node's PID, so that the prober knows who answered.
	n.system.Root.RequestWithCustomSender(sender, &clusterpb.DeliverReplies{LeaseAnswer: a}, n.PID())
}

// onLeaseAnswer takes a peer's answer to this node's probe.
func (n *Node) onLeaseAnswer(sender *actor.PID, a *clusterpb.LeaseAnswer) {
	if sender == nil {
		return
	}
	if n.lease.answer(sender.Address, n.system.ID, a) {
		n.log.Warn("sinkbatch: the cluster dropped this member (a pause or a partition outlasted its health checks); it admits nothing more: leave and start a new member",
			slog.String("member", n.system.ID), slog.String("told_by", sender.Address))
		close(n.excludedCh)
		n.cache.clear()
		for _, g := range n.ledger.grains() {
			n.system.Root.Send(g, yield{})
		}
	}
}

// Excluded is closed once the node learns that the cluster dropped its
// member (its health checks failed: a pause or a partition outlasted
// them). protoactor never takes a dropped member back: the node admits
// nothing from then on, and its callers are answered ErrUnreachable.
// Leave, stop the instance, and start a new actor system, instance, node
// and member: it joins under a new member id.
func (n *Node) Excluded() <-chan struct{} { return n.excludedCh }
