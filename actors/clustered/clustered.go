package clustered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/nilptr"
	"github.com/ankusa/sinkbatch/messages"
)

// Kind is the cluster kind of the destination grains. Every member that
// batches must register it (pass Node.Kind to cluster.WithKinds).
const Kind = "sinkbatch-destination"

// endpointID is the process id of every member's endpoint: the same on all
// members, so that one member can address another's by its address alone.
const endpointID = "sinkbatch-clustered"

// The endpoint also has an id of this node's own, endpointID$ and a random
// 64-bit number in hex: the node sends what it expects answers to (its
// deliveries, cancels and requests) from that id, so the answers come back
// to it. A process restarted at the same address (a fixed host and port) is
// another node: the answers still on their way to its predecessor, whose
// calls were numbered as its own are, reach no process there (a dead
// letter) instead of its calls of the same numbers.
func incarnationID() string {
	return fmt.Sprintf("%s$%016x", endpointID, rand.Uint64())
}

// Destinations names this member's codecs; every member registers the same
// names, each built from its own config and credentials. A name is the
// cluster identity of its destination: not secret, [A-Za-z0-9._-]{1,200}.
// New copies the map: changing it afterwards changes nothing.
type Destinations map[string]codec.Codec

// Config configures a Node.
type Config struct {
	// Instance is the member's local instance, which runs the batchers of
	// the destinations this member owns. The caller starts it, in the
	// actor system New is given, before New and stops it after Leave.
	Instance     *actors.Instance
	Destinations Destinations
	// Logger receives the node's logs; nil: the actor system's logger.
	Logger *slog.Logger
	// MaxWireBytes is the largest gRPC message every member's remote
	// accepts: gRPC's grpc.MaxRecvMsgSize, 4 MiB unless every member's
	// remote config raises it (ReceiveLimit). 0 means 4 MiB. The node
	// keeps what it writes to a member under it: a batch of deliveries
	// takes at most half of it, and the next batch takes the rest. A
	// message that would not fit in half of it alone (its body, strings and
	// attributes) is refused at once with an error that wraps
	// codec.ErrTooLarge, wherever its caller is.
	MaxWireBytes int
}

// defaultWireBytes is gRPC's default limit on a message a server receives.
const defaultWireBytes = 4 << 20

// minWireBytes is the least Config.MaxWireBytes New takes.
const minWireBytes = 64 << 10

var (
	// ErrUnreachable answers a delivery whose destination's owner is
	// unknown, gone or silent until the caller's deadline, or whose owner
	// left the cluster before answering. The message may or may not have
	// been sent: retrying with the same idempotency key is safe.
	ErrUnreachable = errors.New("sinkbatch: the destination's owner is unreachable")
	// ErrUnknownDestination answers a delivery to a name that is not in
	// Config.Destinations: the caller's member's, or the owner's (a rolling
	// deploy that adds a name reaches the members one at a time: give every
	// member the name before anyone delivers to it). Permanent
	// (codec.IsPermanent): nothing was sent.
	ErrUnknownDestination = codec.Permanent(errors.New("sinkbatch: unknown destination"))
)

// errNotDeliver answers what is sent to Node.PID and is not a non-nil
// *Deliver: permanent, and errors.Is messages.ErrNotDeliver.
var errNotDeliver error = notDeliverError{}

type notDeliverError struct{}

func (notDeliverError) Error() string {
	return "sinkbatch: a clustered node takes only a non-nil *clustered.Deliver"
}
func (notDeliverError) Unwrap() error          { return messages.ErrNotDeliver }
func (notDeliverError) PermanentFailure() bool { return true }

var validName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// maxQuotedName is the most bytes of a name an error text or a log quotes:
// a name comes from a caller or a peer, and may be of any length.
const maxQuotedName = 64

// clipName is name quoted, cut to its first maxQuotedName bytes (and its
// length said) when it is longer.
func clipName(name string) string {
	if len(name) <= maxQuotedName {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q... (%d bytes)", name[:maxQuotedName], len(name))
}

// Node is one member's part of cluster mode: it sends every delivery to the
// grain of its destination, on whichever member owns it, and runs the
// grains this member owns on Config.Instance. Its methods are safe for
// concurrent use.
type Node struct {
	// Set by New, read-only after it.
	system  *actor.ActorSystem
	cfg     Config
	log     *slog.Logger
	kind    *cluster.Kind
	replyID string // the endpoint's id of this node's own (incarnationID)
	sub     *eventstream.Subscription

	// Each guards itself, with the guard named here (see each type).
	topo     topology      // owners by the latest member list: topology.mu; its version, atomic
	ledger   *ledger       // the owner's side, by destination: ledger.mu; counts and the callers' view, atomic
	calls    calls         // requests, deliveries through grains and posts, waiting: calls.mu
	direct   directCalls   // deliveries admitted directly, waiting: each shard's mu; each call's token, atomic
	outboxes outboxes      // deliveries waiting to be written to their grains: boxes.mu (before calls.mu, never after)
	replies  replyBoxes    // answers waiting to be written to their callers: boxes.mu (before calls.mu, never after)
	cancels  cancels       // deliveries whose callers on other members cancelled: cancels.mu, behind an atomic count
	cache    pidCache      // grain PIDs by destination: pidCache.mu
	ordered  orderedQueues // actor-form deliveries waiting for an earlier one of their sender and group: orderedQueues.mu
	lease    *lease        // the node's ownership lease: lease.mu; whether it holds, atomic
	inflight callers       // Deliver calls and actor-form deliveries in progress: one atomic word

	// Guarded by cutMu.
	cutMu sync.Mutex
	cut   map[string]time.Time // members whose connection was lost, and when (last time)
	// leftOK: members that said they left gracefully (see Leave), until
	// the member lists drop them or they join again.
	leftOK map[string]bool

	// Atomics.
	cluster atomic.Pointer[cluster.Cluster] // set once, by Attach
	self    atomic.Pointer[actor.PID]       // the endpoint's PID at the system's latest address
	replyTo atomic.Pointer[actor.PID]       // the endpoint's PID under replyID at the system's latest address
	leaving atomic.Bool                     // set once, by Leave
	// withoutLeases (set by tests only) makes the node answer no lease
	// probe, as a member of a version before leases.
	withoutLeases atomic.Bool

	// Channels, each closed once by its one owner.
	left       chan struct{} // by Leave, when it returns
	quit       chan struct{} // by Leave, when it gives up waiting
	excludedCh chan struct{} // by onLeaseAnswer: a peer says the cluster dropped this member
	probeStop  chan struct{} // by Leave: the probe loop ends
	probeDone  chan struct{} // by the probe loop, when it ended

	// Written by the first Leave before it closes left; read after left.
	leaveErr error
}

// New checks cfg and prepares a node; register its Kind with the cluster
// before StartMember, then call Attach. It refuses an Instance of another
// actor system, a destination name outside [A-Za-z0-9._-]{1,200}, and a
// codec that is nil or whose Limits or Tuning no batcher accepts (the error
// names the destination).
func New(system *actor.ActorSystem, cfg Config) (*Node, error) {
	switch {
	case system == nil:
		return nil, fmt.Errorf("sinkbatch: clustered.New: nil actor system")
	case cfg.Instance == nil:
		return nil, fmt.Errorf("sinkbatch: clustered.Config.Instance is nil")
	case cfg.Instance.System() != system:
		// The grain hands deliveries to the instance by its PID, which
		// names a process of the instance's system: sent through another
		// system it reaches nothing (or that system's instance of the same
		// name), and callers would wait out their deadlines.
		return nil, fmt.Errorf("sinkbatch: clustered.Config.Instance runs in another actor system than the node's: start it in the system New is given")
	case len(cfg.Destinations) == 0:
		return nil, fmt.Errorf("sinkbatch: clustered.Config.Destinations is empty")
	}
	// The node keeps a copy: the caller's map stays the caller's, to
	// change without racing the node's reads or changing what it serves.
	dests := make(Destinations, len(cfg.Destinations))
	l := newLease()
	for name, c := range cfg.Destinations {
		if !validName.MatchString(name) {
			return nil, fmt.Errorf("sinkbatch: clustered destination name %s is not [A-Za-z0-9._-]{1,200}", clipName(name))
		}
		if nilptr.Is(c) {
			return nil, fmt.Errorf("sinkbatch: clustered destination %q has a nil codec", name)
		}
		if err := checkCodec(c); err != nil {
			return nil, fmt.Errorf("sinkbatch: clustered destination %q: %w", name, err)
		}
		dests[name] = fence(c, l)
	}
	cfg.Destinations = dests
	switch {
	case cfg.MaxWireBytes == 0:
		cfg.MaxWireBytes = defaultWireBytes
	case cfg.MaxWireBytes < minWireBytes:
		return nil, fmt.Errorf("sinkbatch: clustered.Config.MaxWireBytes is %d; it must be 0 (gRPC's default, 4 MiB) or at least %d", cfg.MaxWireBytes, minWireBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = system.Logger()
	}
	n := &Node{system: system, cfg: cfg, log: cfg.Logger, ledger: newLedger(), left: make(chan struct{}), quit: make(chan struct{}),
		lease: l, excludedCh: make(chan struct{}), probeStop: make(chan struct{}), probeDone: make(chan struct{})}
	n.calls.m = map[uint32]pendingCall{}
	n.outboxes.m = map[pidKey]*outbox{}
	n.outboxes.pool = &pendingPool
	// What a member receives at once: one batch of deliveries and one of
	// answers from this member (see boxes), and protoactor's own messages.
	n.outboxes.size, n.outboxes.budget, n.outboxes.newPost = wireSize, cfg.MaxWireBytes/2, n.newOutgoing
	n.replies.m = map[pidKey]*replyBox{}
	n.replies.size, n.replies.budget, n.replies.newPost = replySize, cfg.MaxWireBytes/4, n.newOutgoingReplies
	n.cut = map[string]time.Time{}
	n.leftOK = map[string]bool{}
	n.cache.m = map[string]*actor.PID{}
	n.kind = cluster.NewKind(Kind, actor.PropsFromProducer(func() actor.Actor { return &grain{n: n} }))
	// The endpoint and the topology are in place before StartMember, which
	// publishes the first topologies and serves grains a second before it
	// returns.
	e := &endpoint{n: n}
	if _, ok := system.ProcessRegistry.Add(e, endpointID); !ok {
		return nil, fmt.Errorf("sinkbatch: clustered.New: process %q is taken (one node per actor system)", endpointID)
	}
	n.replyID = incarnationID()
	if _, ok := system.ProcessRegistry.Add(e, n.replyID); !ok {
		system.ProcessRegistry.Remove(actor.NewPID(system.Address(), endpointID))
		return nil, fmt.Errorf("sinkbatch: clustered.New: process %q is taken", n.replyID)
	}
	n.sub = system.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *cluster.ClusterTopology:
			n.onTopology(e)
		case *remote.EndpointTerminatedEvent:
			n.onCut(e.Address)
		}
	})
	return n, nil
}

// Kind is the grain kind to pass to cluster.WithKinds before StartMember.
func (n *Node) Kind() *cluster.Kind { return n.kind }

// Attach joins the node to c, a started member whose config holds Kind:
// from then on the node serves the grains this member owns and answers
// hand-off requests. It logs a WARN when the member's remote listens beyond
// loopback without transport credentials, or with TLS that lets in a client
// without a certificate or with a self-signed one (see TLSOptions).
func (n *Node) Attach(c *cluster.Cluster) error {
	if c == nil {
		return fmt.Errorf("sinkbatch: clustered.Attach: nil cluster")
	}
	if c.ActorSystem != n.system {
		return fmt.Errorf("sinkbatch: clustered.Attach: the cluster runs on another actor system than the node's")
	}
	switch k, ok := c.Config.Kinds[Kind]; {
	case !ok:
		return fmt.Errorf("sinkbatch: clustered.Attach: the cluster has no kind %q (pass Node.Kind to cluster.WithKinds)", Kind)
	case k != n.kind:
		// Its grains would be another node's, or not sinkbatch's at all.
		return fmt.Errorf("sinkbatch: clustered.Attach: the cluster's kind %q is not this node's (pass this Node's Kind to cluster.WithKinds)", Kind)
	}
	if n.leaving.Load() {
		// Its grains would yield at once, and no Leave would shut c down.
		return fmt.Errorf("sinkbatch: clustered.Attach: the node has left (Leave was called); make a new one")
	}
	if !n.cluster.CompareAndSwap(nil, c) {
		return fmt.Errorf("sinkbatch: clustered.Attach: already attached")
	}
	if rc := c.Config.RemoteConfig; rc != nil && !loopback(rc.Host) {
		switch addr := n.system.Address(); {
		case servesPlaintext(addr):
			n.log.Warn("sinkbatch: cluster member listens beyond loopback without transport credentials: anyone who reaches it can publish to every destination with this member's credentials; use clustered.TLSOptions",
				slog.String("address", addr))
		case servesWithoutClientCert(addr):
			n.log.Warn("sinkbatch: cluster member serves TLS beyond loopback without requiring client certificates: anyone who reaches it can publish to every destination with this member's credentials; use clustered.TLSOptions",
				slog.String("address", addr))
		}
	}
	if rc := c.Config.RemoteConfig; rc != nil && rc.MaxRetryCount > 1 {
		n.log.Warn("sinkbatch: the cluster's remote has MaxRetryCount above 1: a message to a member that does not answer (one that died, or a stranger the provider lists) waits in protoactor's endpoint writer MaxRetryCount × 2 s before it is dropped, and every delivery to the destinations the hash gives that member waits as long; set remote.Config.MaxRetryCount to 1",
			slog.Int("max_retry_count", rc.MaxRetryCount))
	}
	// A topology published before New subscribed is in the member list.
	if n.topo.empty() {
		ms := c.MemberList.Members()
		n.takeTopology(ms.TopologyHash(), ms.Members())
	}
	go n.probeLoop(n.probeStop, n.probeDone)
	return nil
}

// onTopology takes a new member list: every cached grain PID is dropped
// (owners may have moved), and calls to members that left are answered at
// once (see cut).
func (n *Node) onTopology(t *cluster.ClusterTopology) {
	n.takeTopology(t.TopologyHash, t.Members)
	n.cache.clear()
	if len(t.Joined) > 0 {
		n.cutMu.Lock()
		for _, m := range t.Joined {
			delete(n.leftOK, m.Address())
		}
		n.cutMu.Unlock()
	}
	for _, m := range t.Left {
		n.cutOff(m.Address())
		// The member lists' word is the last: its graceful leave is used.
		n.cutMu.Lock()
		delete(n.leftOK, m.Address())
		n.cutMu.Unlock()
	}
}

// takeTopology takes a member list: ownership, and the peers the lease
// waits for.
func (n *Node) takeTopology(hash uint64, members []*cluster.Member) {
	n.topo.update(hash, members)
	self := n.system.Address()
	others := make(map[string]string, len(members))
	for _, m := range members {
		if m.HasKind(Kind) && m.Address() != self {
			others[m.Id] = m.Address()
		}
	}
	n.lease.topology(others)
}

// cutOff gives up on address: what is queued for it is dropped (answers)
// or answered as never sent (deliveries, which try again), and what was
// sent to it is answered ErrUnreachable, or as never admitted (tried
// again) if its member said it left gracefully.
func (n *Node) cutOff(address string) {
	n.outboxes.cut(address)
	n.replies.cut(address)
	n.cutMu.Lock()
	graceful := n.leftOK[address]
	n.cutMu.Unlock()
	n.calls.failMember(address, graceful)
	if address == n.system.Address() {
		// This member was dropped from the cluster.
		n.direct.fail(memberLeft, false)
	}
}

// onLeft takes a member's word that it left gracefully (see Leave): it
// has answered everything it admitted, and those answers reached this
// member before the word did. A call to it that still waits, or is made
// before the member lists drop it, was not admitted.
func (n *Node) onLeft(address string) {
	if address == "" || address == n.system.Address() {
		return
	}
	n.cutMu.Lock()
	n.leftOK[address] = true
	n.cutMu.Unlock()
	n.lease.left(address)
}

// onCut takes protoactor's word that the connection to address is lost or
// could not be made: calls to it are answered ErrUnreachable at once, and
// grains waiting for its hand-off stop waiting (see grain.ask).
func (n *Node) onCut(address string) {
	n.cutMu.Lock()
	n.cut[address] = time.Now()
	n.cutMu.Unlock()
	n.cutOff(address)
}

// cutSince reports whether the connection to address was lost at or after
// t.
func (n *Node) cutSince(address string, t time.Time) bool {
	n.cutMu.Lock()
	defer n.cutMu.Unlock()
	at, ok := n.cut[address]
	return ok && !at.Before(t)
}

// Deliver sends m to destination's batcher, on whichever member owns it,
// and returns the destination's message id when m's own result is known.
// The errors mean what they mean for actors.Instance.Deliver, across the
// wire, plus ErrUnreachable and ErrUnknownDestination. It waits at most
// until the deadline ctx reports (kept by a timer of its own, whether or not
// ctx's Done keeps it), or actors.DefaultTimeout when ctx has none; ctx's
// cancellation ends it sooner, with ErrUnreachable wrapping
// context.Canceled: the cancellation is sent to the owner, which drops m
// unless it sent m before the cancellation arrived. As with actors.Instance.Deliver, m's Body
// and Attributes are read until m's batch is written to its owner (or its
// request ended, on the owner itself), which can be after Deliver returned
// on a cancelled ctx: do not change them after the call. Deliver may be
// called as soon as New returns: until Attach gives the node its first
// topology, a delivery waits for it (within its deadline).
func (n *Node) Deliver(ctx context.Context, destination string, m codec.Message) (string, error) {
	r, err := n.DeliverResult(ctx, destination, m)
	return r.ID, err
}

// PID is where actors send *Deliver, with ctx.Request or a future, to be
// answered with one *messages.Delivered whose Ref is the Deliver's. Ask for
// it after StartMember: the PID holds the member's address.
func (n *Node) PID() *actor.PID { return n.pidAt(&n.self, endpointID) }

// answersTo is the endpoint's PID under the node's own id (replyID): the
// sender of everything the node sends that is answered.
func (n *Node) answersTo() *actor.PID { return n.pidAt(&n.replyTo, n.replyID) }

// pidAt is the endpoint's PID under id at the system's latest address,
// kept in cache.
func (n *Node) pidAt(cache *atomic.Pointer[actor.PID], id string) *actor.PID {
	addr := n.system.Address()
	if pid := cache.Load(); pid != nil && pid.Address == addr {
		return pid
	}
	pid := actor.NewPID(addr, id)
	cache.Store(pid)
	return pid
}

// Deliver is the actor form of Node.Deliver: send it to Node.PID.
type Deliver struct {
	Destination string
	Message     codec.Message
	// Deadline is when the caller stops waiting; zero: actors.DefaultTimeout
	// from when the node receives it.
	Deadline time.Time
	// Ref is echoed in the answer's messages.Delivered.Ref.
	Ref any
}

// LogValue keeps the payload out of logs.
func (d *Deliver) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("destination", d.Destination),
		slog.String("tenant", d.Message.Tenant),
		slog.String("group", d.Message.Group),
		slog.Int("bytes", len(d.Message.Body)),
	)
}

// deliverFor answers an actor-form Deliver, off the endpoint's goroutine
// (its sender's), each on a goroutine of its own. One sender's deliveries
// of one group to one destination are queued for their owner in the order
// it sent them, each once the one before it is (see deliver's queued), so
// that they are admitted in that order, as the local actor form admits
// them.
func (n *Node) deliverFor(sender *actor.PID, d *Deliver) {
	if !n.inflight.enter() {
		if sender != nil {
			n.system.Root.Send(sender, &messages.Delivered{Ref: d.Ref, Err: messages.ErrStopped})
		}
		return
	}
	if d.Message.Group == "" || sender == nil {
		go n.deliverOne(sender, d, nil)
		return
	}
	k := orderKey{sender: sender.Address + "/" + sender.Id, destination: d.Destination, group: d.Message.Group}
	if n.ordered.add(k, d) {
		go func() {
			for d := d; d != nil; d = n.ordered.next(k) {
				queued := make(chan struct{})
				go n.deliverOne(sender, d, func() { close(queued) })
				<-queued
			}
		}()
	}
}

// deliverOne makes one actor-form delivery and answers its sender. It
// counts the delivery out of n.inflight. queued is deliver's.
func (n *Node) deliverOne(sender *actor.PID, d *Deliver, queued func()) {
	defer n.inflight.exit()
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !d.Deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, d.Deadline)
	}
	defer cancel()
	r, err := n.deliver(ctx, d.Destination, d.Message, queued)
	if sender != nil {
		n.system.Root.Send(sender, &messages.Delivered{Ref: d.Ref, ID: r.ID, Sequence: r.Sequence, Err: err})
	}
}

// orderKey names one sender's deliveries of one group to one destination.
type orderKey struct{ sender, destination, group string }

// orderedQueues hold the actor-form deliveries waiting for an earlier one
// of their sender, group and destination to be queued (see
// Node.deliverFor). A key is present while a goroutine starts its
// deliveries, and deleted when it has none left. Safe for concurrent use.
type orderedQueues struct {
	mu sync.Mutex
	m  map[orderKey][]*Deliver // guarded by mu
}

// add queues d under k and reports whether no goroutine makes k's
// deliveries (the caller starts one, which makes d first).
func (q *orderedQueues) add(k orderKey, d *Deliver) (start bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if waiting, ok := q.m[k]; ok {
		q.m[k] = append(waiting, d)
		return false
	}
	if q.m == nil {
		q.m = map[orderKey][]*Deliver{}
	}
	q.m[k] = nil
	return true
}

// next is k's next delivery, or nil (k deleted) when none is left.
func (q *orderedQueues) next(k orderKey) *Deliver {
	q.mu.Lock()
	defer q.mu.Unlock()
	waiting := q.m[k]
	if len(waiting) == 0 {
		delete(q.m, k)
		return nil
	}
	d := waiting[0]
	waiting[0] = nil
	q.m[k] = waiting[1:]
	return d
}

// shutdown leaves the cluster gracefully. protoactor's remote can panic
// as it stops (a send on a closed channel, when a peer's stream to this
// member fails at that moment: its endpoint reader closes the channel
// before it forgets it); the panic is logged instead of taking the
// process down, and the remote's server is stopped at once, as the
// panic kept the graceful stop from doing.
func (n *Node) shutdown(c *cluster.Cluster) {
	defer func() {
		if r := recover(); r != nil {
			n.log.Error("sinkbatch: protoactor panicked leaving the cluster; its remote is stopped at once", slog.Any("panic", r))
			func() {
				defer func() { _ = recover() }()
				c.Remote.Shutdown(false)
			}()
		}
	}()
	c.Shutdown(true)
}

// sayLeft tells every other member that this one admits nothing more and
// has answered everything it admitted: a HandoffDone naming no destination,
// sent to their nodes once every answer queued for them is written, on the
// same connections, so it arrives after them. It then waits for each of
// them that takes part in leases to answer a lease probe sent after the
// word: a member reads what another sends it in order, so it has then
// taken every answer and the word, and the member lists may drop this
// member (protoactor's cluster.Shutdown, next, does so at once). A member
// that takes the drop before the word answers the calls still waiting for
// this member ErrUnreachable; one that takes it after, as never admitted.
// Each wait ends with ctx, and after leftWordWait in all: a member that
// does not answer is not waited for longer. protoactor's cluster.Shutdown
// then keeps this member's remote up for 2 s after the member lists drop
// it, but what is sent to it then is never answered: a caller that took
// those attempts for admitted would answer ErrUnreachable for a delivery
// that was never made.
func (n *Node) sayLeft(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, leftWordWait)
	defer cancel()
	mark := n.replies.mark()
	waitFor(ctx, func() bool { return n.replies.gone(mark) })
	self := n.system.Address()
	left := &clusterpb.HandoffDone{Member: self}
	others := n.topo.others(self)
	for _, a := range others {
		n.system.Root.Send(actor.NewPID(a, endpointID), left)
	}
	since := n.lease.now()
	n.probe()
	waitFor(ctx, func() bool {
		if n.lease.excluded.Load() {
			// The others dropped this member for good already.
			return true
		}
		for _, a := range others {
			if n.lease.speaks(a) && !n.lease.heardSince(a, since) {
				return false
			}
		}
		return true
	})
}

// leftWordWait bounds how long Leave waits, once it has answered
// everything, for its answers to be written and for the other members to
// take its word that it left (see sayLeft).
const leftWordWait = 2 * time.Second

// waitFor waits until done reports true, checking it every millisecond,
// or until ctx ends.
func waitFor(ctx context.Context, done func() bool) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for !done() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// handPausesOver sends the groups this member's instance has paused
// (Tuning.StrictGroups) to the members that own their destinations once it
// has left, before it says it left: they pause them before the member
// lists drop this member, which is when their grains begin to admit. It
// runs once the member admits nothing and has answered everything.
func (n *Node) handPausesOver() {
	self := n.system.Address()
	for name := range n.cfg.Destinations {
		paused := n.takePauses(name)
		if len(paused) == 0 {
			continue
		}
		if to := n.topo.ownerWithout(name, self); to != "" {
			n.system.Root.Send(actor.NewPID(to, endpointID), &clusterpb.HandoffDone{Destination: name, Member: self, Paused: paused})
		}
	}
}

// Leave hands off every destination this member owns and leaves the
// cluster, in this order: the member stops admitting deliveries (callers
// are turned to the other members, which wait for the hand-off before they
// admit any) and Deliver answers messages.ErrStopped, as it does a delivery
// in progress of this member's callers to a destination the member owns
// and had not admitted; everything the member admitted is answered by its
// batchers; deliveries this member's callers have in progress elsewhere
// are answered; its answers are written and the other members take its
// word that it left (sayLeft; at most 2 s); then the member leaves the
// cluster gracefully (cluster.Shutdown(true)), which also shuts down the
// actor system. Stop Config.Instance afterwards: an instance stopped
// before Leave answers every delivery to the destinations this member owns,
// from any member, with messages.ErrStopped (never sent) until Leave hands
// them off. If ctx ends first, the
// member leaves all the same and Leave returns an error wrapping ctx.Err():
// what was not answered then reaches its callers at once, as ErrUnreachable
// (messages.ErrStopped for a message this member had not yet written to its
// owner, which it never will). protoactor's own shutdown, which takes 2 s
// and up to 10 s more when a member this one talked to has died, is bounded
// by ctx too: if ctx ends during it, Leave returns an error wrapping
// ctx.Err() and the shutdown finishes in the background. Later calls wait
// for the first and return its result, or return when their own ctx ends
// (an error wrapping ctx.Err()). A nil ctx is answered
// actors.ErrNilContext and starts nothing.
func (n *Node) Leave(ctx context.Context) error {
	if ctx == nil {
		return actors.ErrNilContext
	}
	if !n.leaving.CompareAndSwap(false, true) {
		// Another call leaves: wait for it, or for this call's ctx.
		select {
		case <-n.left:
			return n.leaveErr
		default:
		}
		select {
		case <-n.left:
			return n.leaveErr
		case <-ctx.Done():
			return fmt.Errorf("sinkbatch: clustered.Leave: waiting for an earlier Leave: %w", ctx.Err())
		}
	}
	func() {
		defer close(n.left)
		grains, idle := n.ledger.leave()
		for _, g := range grains {
			n.system.Root.Send(g, yield{})
		}
		done := n.inflight.close()
		drained := make(chan struct{})
		go func() {
			<-idle
			<-done
			close(drained)
		}()
		select {
		case <-drained:
			n.handPausesOver()
			n.sayLeft(ctx)
		case <-ctx.Done():
			n.leaveErr = fmt.Errorf("sinkbatch: clustered.Leave: %w", ctx.Err())
			// Nothing will answer what is left: release its waiters.
			close(n.quit)
			n.ledger.abandon()
			n.outboxes.cut("")
			n.replies.cut("")
			n.calls.failAll()
			n.direct.fail(nodeQuit, true)
		}
		// protoactor's graceful shutdown takes 2 s at least, and 10 s
		// when the connection to a member that died is still retrying its
		// dial (its remote waits for that endpoint writer to stop): it
		// goes on in the background once ctx ends.
		shut := make(chan struct{})
		go func() {
			defer close(shut)
			if c := n.cluster.Load(); c != nil {
				close(n.probeStop)
				<-n.probeDone
				n.shutdown(c)
			}
			n.system.EventStream.Unsubscribe(n.sub)
			n.system.ProcessRegistry.Remove(actor.NewPID(n.system.Address(), endpointID))
			n.system.ProcessRegistry.Remove(actor.NewPID(n.system.Address(), n.replyID))
		}()
		select {
		case <-shut:
		case <-ctx.Done():
			if n.leaveErr == nil {
				n.leaveErr = fmt.Errorf("sinkbatch: clustered.Leave: handed off and left, but protoactor's shutdown outlived ctx and goes on in the background: %w", ctx.Err())
			}
		}
		<-drained
	}()
	return n.leaveErr
}

// checkCodec is the check a batcher makes of c's Limits and Tuning as it
// starts, made here so that a codec no batcher takes is refused when the
// member starts rather than delivery by delivery on whichever member owns
// it. A panic in the codec is an error too.
func checkCodec(c codec.Codec) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the codec panicked in Limits or Tuning: %v", p)
		}
	}()
	return actors.CheckCodec(c)
}

// loopback reports whether host is a loopback address or name.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// callers counts a node's deliveries in progress, and tells Leave when none
// is left once it closed the count to newcomers. Safe for concurrent use.
// Every delivery enters and exits, so the count is one atomic word (a
// mutex taken twice per delivery was among the most contended locks).
type callers struct {
	state atomic.Int64 // deliveries in progress, plus callersClosed once closed
	// zero is made by close, before it sets callersClosed, and read only
	// after that bit is seen; closed (once) when none is left.
	zero chan struct{}
	once sync.Once
}

// callersClosed is the bit of callers.state that close sets.
const callersClosed = int64(1) << 62

// enter counts a delivery in, unless Leave has begun.
func (c *callers) enter() bool {
	if c.state.Add(1)&callersClosed != 0 {
		c.exit()
		return false
	}
	return true
}

// exit counts a delivery out. Once closed, a count of zero is final: no
// delivery enters any more.
func (c *callers) exit() {
	if c.state.Add(-1) == callersClosed {
		c.once.Do(func() { close(c.zero) })
	}
}

// close refuses newcomers and returns a channel closed once none is left.
// It is called once.
func (c *callers) close() <-chan struct{} {
	c.zero = make(chan struct{})
	if c.state.Or(callersClosed) == 0 {
		c.once.Do(func() { close(c.zero) })
	}
	return c.zero
}
