package clustered

// Calls is how many calls the node has begun: one per delivery admitted
// directly; a delivery through the grain begins one, and its batch
// message another.
func (n *Node) Calls() uint32 {
	n.calls.mu.Lock()
	defer n.calls.mu.Unlock()
	return n.calls.seq
}

// DirectCalls is how many deliveries this member's callers admitted
// directly.
func (n *Node) DirectCalls() uint64 { return n.direct.added() }

// CutOff gives up on address, as the member lists dropping it would.
func (n *Node) CutOff(address string) { n.cutOff(address) }

// OpenHere reports whether this member's own callers admit deliveries to
// destination directly, now.
func (n *Node) OpenHere(destination string) bool {
	h := (*n.ledger.view.Load())[destination]
	return h != nil && h.open.Load() != 0 && h.open.Load() == n.topo.version.Load()
}

// NewTopologyVersion bumps the node's topology version, as a member list
// that changes no owner would.
func (n *Node) NewTopologyVersion() { n.topo.version.Add(1) }

// CancelsKept is how many cancels of its callers' deliveries the node
// keeps.
func (n *Node) CancelsKept() int { return int(n.cancels.n.Load()) }

// AnswerNoLeaseProbes makes the node answer no lease probe, as a member of
// a version before leases.
func (n *Node) AnswerNoLeaseProbes() { n.withoutLeases.Store(true) }

// MembersSeen is how many members hosting Kind the node's latest member
// list holds: safe to call at any time, unlike protoactor's
// MemberList.Members, which a provider's goroutine replaces unguarded.
func (n *Node) MembersSeen() int {
	n.topo.mu.RLock()
	defer n.topo.mu.RUnlock()
	return len(n.topo.members)
}
