package clustered

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// Timing of a grain's hand-off.
const (
	// handoffRetry is how often a waiting grain asks again the members
	// that have not answered its HandoffRequest: a request to a grain that
	// is stopping is dropped, and so is one to a member being dialled.
	handoffRetry = 100 * time.Millisecond
	// yieldLinger is how long a grain that yielded keeps answering
	// "not the owner" before it stops. Deliveries sent to an actor between
	// its stop and its name's removal are dropped without an answer; by
	// lingering, the callers that still hold its PID learn to look again.
	yieldLinger = 250 * time.Millisecond
	// handoffGiveUp is how long a member's HandoffRequests must keep
	// coming back as dead letters (it cannot be connected to) before a
	// waiting grain stops waiting for it.
	handoffGiveUp = time.Second
	// handoffSilence is how long a waiting grain waits for a member that
	// has said nothing since it began (no HandoffDone, no answer to a
	// lease probe): a process the provider lists that is no member
	// (a stranger at a listed health port), or one that cannot answer.
	// It counts from when the grain began to wait or, if later, from the
	// first answer any peer gave this node: a node that has heard nobody
	// yet (it has just joined, and its connections are still being made)
	// cannot tell a silent member from a slow start of its own, and taking
	// a live member's destination over would let two requests of a group
	// overlap. handoffSilenceMax bounds the wait in any case (a node whose
	// only peers are strangers). A member that answers probes is waited
	// for until it hands off.
	handoffSilence    = 500 * time.Millisecond
	handoffSilenceMax = 5 * time.Second
	// maxBuffered bounds the deliveries a grain holds while it waits for
	// its hand-off; more are refused with *messages.RetryAfterError.
	maxBuffered = 4096
	// adoptWait bounds how long an adoption (Node.adoptPauses) waits for
	// the instance to take the paused groups handed over (a batcher's
	// mailbox's turn); they are paused before anything admitted after it
	// in any case.
	adoptWait = 5 * time.Second
)

type grainState int

const (
	waiting   grainState = iota // asking the other members to hand off
	admitting                   // handing deliveries to the local instance
	yielding                    // refusing everything, then stopping
	// unknown: the destination is not configured here (a rolling deploy
	// that adds a name reaches the members one at a time): the grain
	// answers ErrUnknownDestination until it stops, after lingering.
	unknown
)

// yield tells a grain to stop admitting, hand its destination off and stop.
type yield struct{}

// retryTick makes a waiting grain ask again.
type retryTick struct{}

// stopTick ends a yielded grain's linger.
type stopTick struct{}

// stopNow stops a grain whose name is gone (see grain.stop): everything
// sent to it before is in its mailbox ahead of it.
type stopNow struct{}

// adopted tells a waiting grain that no adoption of its destination's
// handed-over pauses is in flight any more (ledger.adopting).
type adopted struct{}

// grain is the one admitter of a destination's deliveries in the cluster,
// written by hand rather than generated because the generated grains answer
// inside Receive, which would let one request through at a time.
//
// A grain admits only while its member owns the destination in the latest
// topology, and only after every other member has answered HandoffDone:
// then no other member admits the destination, and everything any of them
// admitted has been answered. A grain told to hand off, or that finds it is
// not the owner, refuses from then on ("not the owner": the caller looks
// again), lingers, and stops. A grain's fields are touched only by its
// Receive.
type grain struct {
	n           *Node
	destination string
	codec       codec.Codec
	state       grainState
	awaiting    map[string]bool      // members whose HandoffDone is missing
	unreached   map[string]time.Time // awaited members whose requests dead-lettered, since when
	askedAt     time.Time            // when the grain began to wait
	askedNanos  int64                // askedAt on the lease's clock
	ownedAt     uint64               // the topology version owns was computed for
	owns        bool                 // the member owns destination in that version
	openAt      uint64               // the topology version the ledger was last opened in (ledger.open)
	held        *held                // the grain's ledger entry, from register
	buffered    []parked             // deliveries received while waiting, in order
	timer       *time.Timer
	// process is the grain's own, kept once its name is gone (see stop):
	// its PID no longer reaches it.
	process actor.Process
}

// parked is a delivery a waiting grain holds.
type parked struct {
	req      *clusterpb.DeliverRequest
	sender   *actor.PID // the caller process; nil: nobody is answered
	deadline time.Time
}

func (g *grain) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *cluster.ClusterInit:
		g.start(ctx, m.Identity.Identity)
	case *clusterpb.DeliverBatch:
		// nil only from a sender in this process: nothing to deliver.
		if m != nil {
			g.deliverBatch(ctx, m, ctx.Sender())
			g.cancel(ctx.Sender(), m.Cancels)
		}
	case *outgoing:
		// A batch from this member: taken as it is received.
		g.deliverBatch(ctx, m.take(), ctx.Sender())
	case *clusterpb.HandoffDone:
		if m == nil {
			break
		}
		// The first HandoffDone of a member carries its pauses: it took
		// them from its instance as it handed off. Their adoption begins
		// at once, and the grain goes on receiving but admits nothing
		// until it is over (see ask); they stay in the instance if the
		// grain yields before it admits (the next hand-off, which waits
		// for the adoption, takes them from there).
		if g.state == waiting && g.awaiting[m.Member] {
			delete(g.awaiting, m.Member)
			g.n.adoptPauses(g.destination, m.Member, m.Paused)
		} else {
			// The grain stopped waiting for it (it yields, or gave up on
			// the member): its pauses, taken from the member, are passed
			// on to the owner rather than lost.
			g.n.passPausesOn(g.destination, m.Member, m.Paused)
		}
		if g.state == waiting {
			g.ask(ctx, false)
		}
	case *actor.DeadLetterResponse:
		if m != nil && g.state == waiting && m.Target != nil {
			g.unreachable(ctx, m.Target.Address)
		}
	case retryTick:
		if g.state == waiting {
			g.ask(ctx, true)
		}
	case adopted:
		if g.state == waiting {
			g.ask(ctx, false)
		}
	case yield:
		g.yield(ctx)
	case stopTick:
		g.stop(ctx)
	case stopNow:
		g.process.Stop(ctx.Self())
	case *actor.Stopping:
		g.abandonPosts(ctx)
		g.refuseBuffered()
		g.n.apply(g.n.ledger.unregister(g.destination, ctx.Self()))
		if g.timer != nil {
			g.timer.Stop()
		}
	case *actor.Stopped:
		g.abandonPosts(ctx)
	}
}

// abandonPosts answers the deliveries this member queued for the grain,
// which protoactor drops from the moment it stops until its name is free
// (then they come back as dead letters): they were never sent.
func (g *grain) abandonPosts(ctx actor.Context) {
	g.n.calls.failQueued(g.n.abandonGrain(ctx.Self()), notSent)
}

// start begins the grain's life: it registers as its member's admitter of
// destination and asks every other member to hand it off.
func (g *grain) start(ctx actor.Context, destination string) {
	g.destination = destination
	g.codec = g.n.cfg.Destinations[destination]
	if g.codec == nil {
		// Not a configured name (a peer's config names it: a rolling
		// deploy adds it, or the peer is no member of ours): the deliveries
		// that reach the grain are answered ErrUnknownDestination, and it
		// stops after lingering, so an activation leaves nothing behind.
		// Yielding would send callers back here: they look the owner up
		// again and find this member, until their deadlines.
		g.state = unknown
		g.after(ctx, yieldLinger, stopTick{})
		return
	}
	if g.owned() {
		g.held = g.n.ledger.register(destination, ctx.Self())
	}
	if g.held == nil {
		g.yield(ctx)
		return
	}
	g.awaiting = map[string]bool{}
	g.askedAt, g.askedNanos = time.Now(), g.n.lease.now()
	for _, a := range g.n.topo.others(g.n.system.Address()) {
		g.awaiting[a] = true
	}
	g.ask(ctx, true)
}

// ask sends a HandoffRequest to each member still awaited (if send), and
// admits once none is and the pauses they handed over are adopted. Members that left the topology are not awaited, nor
// are those protoactor lost its connection to while the grain waited:
// what they held is lost with them, as with a crash. (A connection that
// drops while a live member still has a request in flight lets that
// request overlap the new owner's; the package doc says so.)
func (g *grain) ask(ctx actor.Context, send bool) {
	silent := g.silenceOver()
	for a := range g.awaiting {
		switch {
		case !g.n.topo.has(a) || g.n.cutSince(a, g.askedAt):
			delete(g.awaiting, a)
		case silent && !g.n.lease.heardSince(a, g.askedNanos):
			g.n.log.Warn("sinkbatch: taking a destination over without the hand-off of a member that has said nothing",
				slog.String("destination", clipName(g.destination)), slog.String("member", a), slog.Duration("waited", time.Since(g.askedAt)))
			delete(g.awaiting, a)
		}
	}
	if len(g.awaiting) == 0 {
		if g.n.ledger.adopting(g.destination, ctx.Self()) {
			// Pauses handed over are on their way into the instance:
			// admit once they are in (adopted).
			return
		}
		g.state = admitting
		if g.timer != nil {
			g.timer.Stop()
		}
		for _, b := range g.buffered {
			g.admitOrRefuse(b)
		}
		g.buffered = nil
		if g.owned() && !g.n.leaving.Load() {
			g.open(ctx)
		}
		return
	}
	if send {
		req := &clusterpb.HandoffRequest{Destination: g.destination}
		for a := range g.awaiting {
			ctx.Request(actor.NewPID(a, endpointID), req)
		}
		g.after(ctx, handoffRetry, retryTick{})
	}
}

// silenceOver reports whether a member that has said nothing since the
// grain began to wait is no longer waited for (see handoffSilence).
func (g *grain) silenceOver() bool {
	now := g.n.lease.now()
	if now-g.askedNanos >= int64(handoffSilenceMax) {
		return true
	}
	first, heard := g.n.lease.heardAnyone()
	return heard && now-max(g.askedNanos, first) >= int64(handoffSilence)
}

// unreachable notes that a HandoffRequest to member came back undelivered:
// the member cannot be connected to. Once that has lasted handoffGiveUp the
// grain stops waiting for it, as for a member that left: a member nobody can
// reach can hold no delivery from them. (It may hold its own callers'
// deliveries: see the package doc on partitions.)
func (g *grain) unreachable(ctx actor.Context, member string) {
	if !g.awaiting[member] {
		return
	}
	if g.unreached == nil {
		g.unreached = map[string]time.Time{}
	}
	since, seen := g.unreached[member]
	if !seen {
		g.unreached[member] = time.Now()
		return
	}
	if time.Since(since) >= handoffGiveUp {
		g.n.log.Warn("sinkbatch: taking a destination over without the hand-off of a member that cannot be reached",
			slog.String("destination", g.destination), slog.String("member", member))
		delete(g.awaiting, member)
		g.ask(ctx, false)
	}
}

// after sends msg to the grain after d.
func (g *grain) after(ctx actor.Context, d time.Duration, msg any) {
	if g.timer != nil {
		g.timer.Stop()
	}
	self, root := ctx.Self(), g.n.system.Root
	g.timer = time.AfterFunc(d, func() { root.Send(self, msg) })
}

// owned reports whether the member owns the destination in the latest
// topology, computing it once per topology version.
func (g *grain) owned() bool {
	if v := g.n.topo.version.Load(); v != g.ownedAt || v == 0 {
		g.ownedAt = v
		g.owns = g.n.topo.owner(g.destination) == g.n.system.Address()
	}
	return g.owns
}

// deliverBatch takes a batch's deliveries, in their order.
func (g *grain) deliverBatch(ctx actor.Context, b *clusterpb.DeliverBatch, sender *actor.PID) {
	now := time.Now()
	for _, req := range b.Requests {
		g.deliver(ctx, req, sender, now)
	}
}

// deliver takes one delivery, received at now.
func (g *grain) deliver(ctx actor.Context, req *clusterpb.DeliverRequest, sender *actor.PID, now time.Time) {
	if g.state != yielding && (!g.owned() || g.n.leaving.Load()) {
		g.yield(ctx)
	}
	b := parked{req: req, sender: sender, deadline: now.Add(time.Duration(req.BudgetNanos))}
	switch g.state {
	case unknown:
		g.n.reply(sender, &clusterpb.DeliverReply{Call: req.Call, Error: encodeError(ErrUnknownDestination)})
	case yielding:
		g.n.reply(sender, &clusterpb.DeliverReply{Call: req.Call, NotOwner: true})
		if !g.owned() && !g.n.leaving.Load() {
			// The caller's member list still names this member: it
			// comes back here, and must find the grain, not its stop.
			g.after(ctx, yieldLinger, stopTick{})
		}
	case waiting:
		if len(g.buffered) >= maxBuffered {
			g.n.reply(sender, &clusterpb.DeliverReply{Call: req.Call, Error: encodeError(&messages.RetryAfterError{After: handoffRetry, Reason: messages.FullEntries})})
			return
		}
		g.buffered = append(g.buffered, b)
	case admitting:
		if g.admitOrRefuse(b) {
			g.open(ctx)
		}
	}
}

// admitOrRefuse admits b while the node holds its lease; otherwise it
// answers "not the owner" (its caller tries again, within its deadline),
// and reports whether it admitted.
func (g *grain) admitOrRefuse(b parked) bool {
	if !g.n.lease.holds() {
		g.n.reply(b.sender, &clusterpb.DeliverReply{Call: b.req.Call, NotOwner: true})
		return false
	}
	g.admit(b, newAdmitted())
	return true
}

// open lets the member's own callers admit directly (Node.here) in the
// topology version the grain found its member owns the destination in,
// once per version. Only an admitting grain that checked ownership calls
// it.
func (g *grain) open(ctx actor.Context) {
	if g.openAt != g.ownedAt {
		g.openAt = g.ownedAt
		g.n.ledger.open(g.destination, ctx.Self(), g.ownedAt)
	}
}

// admit hands a delivery to the local instance, with a as its record: the
// instance answers it through a (see admitted.Answer).
func (g *grain) admit(b parked, a *admitted) {
	n := g.n
	a.replyTo = b.sender
	n.ledger.admit(g.held)
	n.admit(a, g.held, b.req.Call, messages.Deliver{
		Codec:       g.codec,
		Message:     fromWire(b.req),
		Deadline:    b.deadline,
		SpanContext: spanFromWire(b.req.Parent, b.sender != nil && b.sender.Address != n.system.Address()),
	})
}

// admit hands d, a delivery counted in h, to the local instance with a as
// its record, answered under call.
func (n *Node) admit(a *admitted, h *held, call uint32, d messages.Deliver) {
	a.n, a.held, a.call = n, h, call
	a.direct = actors.Direct{Listener: a, Sender: n.PID(), Room: &a.room}
	a.deliver = d
	a.deliver.Ref = &a.direct
	// No envelope: the instance answers the Direct's Listener.
	n.system.Root.Send(n.cfg.Instance.PID(), &a.deliver)
}

// admitted is a delivery a grain handed to the local instance: its Deliver,
// whom to answer, and room for the batcher's entry, in one allocation. It is
// the Listener of its own Deliver: the batcher answers it directly, and the
// instance's other answers (a refusal while it stops) reach it through the
// endpoint as a *messages.Delivered whose Ref is its Direct.
//
// It is also its Room's Owner: a batcher that answered it from its
// request's result lets go of it after its last touch (Release), and it
// serves another delivery. Its answer keeps nothing of it (the reply is a
// record of its own), so nobody else holds it then; a record the batcher
// never lets go of (refused, expired, answered by a restart) is left to the
// collector.
//
// Its fields are set by whoever admits it (a grain's Receive, or a caller
// in Node.here) before it is sent to the instance, and read-only after
// (the send orders them before the batcher's reads), but for answered and
// unleased, atomics that the batcher's goroutines and the endpoint race
// on, and room, the batcher's.
type admitted struct {
	n       *Node
	held    *held      // the ledger entry it is counted in
	replyTo *actor.PID // the caller process; nil: nobody is answered
	call    uint32     // the DeliverRequest's
	// hereCall, if not nil: admitted directly by a caller of this member
	// (Node.here), whose call it is, under token.
	hereCall *directCall
	token    uint64
	answered atomic.Bool
	unleased atomic.Bool // Listening said no for want of the lease
	direct   actors.Direct
	deliver  messages.Deliver
	room     actors.Room // the batcher's entry for the delivery
}

// admittedPool recycles the records batchers let go of.
var admittedPool = sync.Pool{New: func() any { return new(admitted) }}

// newAdmitted is a zeroed record, owner of its Room.
func newAdmitted() *admitted {
	a := admittedPool.Get().(*admitted)
	a.room.SetOwner(a)
	return a
}

// Release is the batcher letting go of a, after answering it: a serves
// another delivery.
func (a *admitted) Release() {
	*a = admitted{}
	admittedPool.Put(a)
}

// Listening reports whether the delivery's caller still waits for it: a
// caller that admitted directly, while its call still waits with a's token;
// another, until it cancels (its deadline the batcher keeps itself).
func (a *admitted) Listening(*actor.PID) bool {
	if !a.n.lease.holds() {
		// Not sent without the lease: answered "not sent" (Forgotten).
		a.unleased.Store(true)
		return false
	}
	switch {
	case a.hereCall != nil:
		return a.hereCall.pending.Load() == a.token
	case a.replyTo != nil:
		return !a.n.cancels.has(callKey{a.replyTo.Address, a.replyTo.Id, a.call})
	}
	return true
}

// settled forgets the cancel of a's caller, if any: a is answered or
// forgotten.
func (a *admitted) settled() {
	if a.replyTo != nil {
		a.n.cancels.done(callKey{a.replyTo.Address, a.replyTo.Id, a.call})
	}
}

// Forgotten is the batcher dropping the delivery, unsent and unanswered,
// as its caller stopped waiting or the node lost its lease: it counts as
// answered in the ledger, once. A caller that gave up is not answered; one
// whose delivery the lease dropped is answered "not sent", and tries again.
func (a *admitted) Forgotten(*actor.PID) {
	if !a.answered.CompareAndSwap(false, true) {
		return
	}
	a.settled()
	n := a.n
	if a.unleased.Load() {
		// Dropped for want of the lease, not by its caller.
		a.answerUnleased()
	}
	n.apply(n.ledger.answered(a.held))
}

// answerUnleased answers the delivery's caller that it was not sent for
// want of the lease: a caller that admitted directly gets errUnleased,
// another "not the owner"; either tries again.
func (a *admitted) answerUnleased() {
	if a.hereCall != nil {
		a.n.direct.answer(a.hereCall, a.token, codec.Result{Err: errUnleased})
	} else {
		a.n.reply(a.replyTo, &clusterpb.DeliverReply{Call: a.call, NotOwner: true})
	}
}

// Answer sends the delivery's answer to its caller and counts it answered
// in the ledger, once.
func (a *admitted) Answer(_ *actor.PID, r codec.Result) {
	if !a.answered.CompareAndSwap(false, true) {
		return
	}
	n, h := a.n, a.held
	a.settled()
	switch {
	case errors.Is(r.Err, errLeaseLapsed):
		// Not sent (the fenced codec made no request): answered as a
		// delivery dropped for want of the lease.
		a.answerUnleased()
	case a.hereCall != nil:
		n.direct.answer(a.hereCall, a.token, r)
	default:
		n.reply(a.replyTo, &clusterpb.DeliverReply{Call: a.call, Id: r.ID, Sequence: r.Sequence, Error: encodeError(r.Err)})
	}
	n.apply(n.ledger.answered(h))
}

// stop ends the grain's linger. protoactor drops, unanswered, the messages
// still in a mailbox when its actor stops: a caller whose delivery was on
// its way would wait until its deadline, since its owner's member is still
// there and nothing fails the call. So the grain's name goes first: what is
// sent to it from then on comes back to its sender as a dead letter, which
// answers the delivery not sent; what is already in its mailbox is refused
// ("not the owner") as during the linger, and the grain stops once stopNow,
// sent behind it, comes.
func (g *grain) stop(ctx actor.Context) {
	if g.process != nil {
		// Stopping already: a tick armed before the first one came.
		return
	}
	self := ctx.Self()
	p, ok := g.n.system.ProcessRegistry.GetLocal(self.Id)
	if !ok {
		ctx.Stop(self)
		return
	}
	g.process = p
	g.n.system.ProcessRegistry.Remove(self)
	p.SendUserMessage(self, stopNow{})
}

// yield stops admitting for good: buffered deliveries are refused, the
// ledger hands the destination off once what was admitted is answered, and
// the grain stops after lingering.
func (g *grain) yield(ctx actor.Context) {
	if g.state == yielding {
		return
	}
	g.state = yielding
	g.refuseBuffered()
	g.n.apply(g.n.ledger.unregister(g.destination, ctx.Self()))
	g.after(ctx, yieldLinger, stopTick{})
}

func (g *grain) refuseBuffered() {
	for _, b := range g.buffered {
		g.n.reply(b.sender, &clusterpb.DeliverReply{Call: b.req.Call, NotOwner: true})
	}
	g.buffered = nil
}
