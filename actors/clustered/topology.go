package clustered

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/cluster"
)

// topology is the latest member list a Node has seen and the owner it
// gives each destination: the member protoactor's disthash lookup activates
// a destination's grain on, by the same rendezvous hash. Safe for
// concurrent use.
type topology struct {
	version atomic.Uint64 // bumped by each update, after it
	mu      sync.RWMutex
	// Guarded by mu; each update replaces them whole, so a reader may keep
	// what it read after it lets go.
	rdv     *cluster.Rendezvous
	members map[string]bool // addresses of the members that host Kind
	list    []*cluster.Member
	hash    uint64
}

// update takes a new member list.
func (t *topology) update(hash uint64, members []*cluster.Member) {
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(members)
	set := make(map[string]bool, len(members))
	for _, m := range members {
		if m.HasKind(Kind) {
			set[m.Address()] = true
		}
	}
	t.mu.Lock()
	t.rdv, t.members, t.list, t.hash = rdv, set, members, hash
	t.mu.Unlock()
	t.version.Add(1)
}

// owner is the address of the member that owns destination, "" if no
// member hosts Kind.
func (t *topology) owner(destination string) string {
	t.mu.RLock()
	rdv := t.rdv
	t.mu.RUnlock()
	if rdv == nil {
		return ""
	}
	return rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Identity: destination, Kind: Kind})
}

// ownerWithout is the address of the member that owns destination once
// the member at address has left: the one the rendezvous hash ranks next.
func (t *topology) ownerWithout(destination, address string) string {
	t.mu.RLock()
	list := t.list
	t.mu.RUnlock()
	rest := make([]*cluster.Member, 0, len(list))
	for _, m := range list {
		if m.Address() != address {
			rest = append(rest, m)
		}
	}
	if len(rest) == 0 {
		return ""
	}
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(rest)
	return rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Identity: destination, Kind: Kind})
}

// hasMember reports whether the member list holds the member id at
// address.
func (t *topology) hasMember(id, address string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, m := range t.list {
		if m.Id == id && m.Address() == address {
			return true
		}
	}
	return false
}

// has reports whether address is a member hosting Kind.
func (t *topology) has(address string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.members[address]
}

// others are the addresses of the members hosting Kind other than self.
func (t *topology) others(self string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]string, 0, len(t.members))
	for a := range t.members {
		if a != self {
			out = append(out, a)
		}
	}
	return out
}

// empty reports whether no member list was taken yet.
func (t *topology) empty() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.rdv == nil
}
