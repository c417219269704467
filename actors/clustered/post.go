package clustered

import (
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
)

// This file is how deliveries and their answers cross the wire in batches.
// A member's deliveries to one grain queue in an outbox; the first one
// queued when no batch message is on its way posts one (an *outgoing) at
// once, and every delivery queued until that message is written rides in
// it: protoactor's endpoint writer calls its Serialize as it writes it (a
// grain on the same member calls take as it receives it). Owners answer the
// same way, one reply box per caller process. So a light load is sent at
// once, one delivery per message, and a heavy one pays protoactor's
// per-message cost (envelope, type lookup, mailbox, a goroutine to wake) per
// batch. Each delivery keeps its own call number and its own answer.

// stalledPost is how long a post may stay neither written nor dead-lettered
// before the next delivery queued behind it posts another. protoactor drops
// without a word the messages left in the mailbox of an actor that stops
// (a grain, an endpoint writer); the loss of a connection or a member is
// seen sooner (Node.onCut, Node.onTopology). A post taken late finds its box
// empty and goes as an empty batch.
const stalledPost = time.Second

// pidKey is a process's address and id: a PID without its request id.
type pidKey struct{ address, id string }

// queuedDelivery is one attempt of a delivery, waiting in an outbox.
type queuedDelivery struct {
	call     uint32
	deadline time.Time
	message  codec.Message
	parent   *clusterpb.SpanContext
}

// outboxes are a node's deliveries queued for grains, one outbox per grain
// with a post on its way. Safe for concurrent use; outboxes.mu may be held
// while calls.mu is taken, never the reverse.
type outboxes struct {
	mu sync.Mutex
	m  map[pidKey]*outbox
}

// outbox is the deliveries queued for one grain. Guarded by outboxes.mu.
type outbox struct {
	key         pidKey
	destination string
	pending     *[]queuedDelivery // from pendingPool; nil: none
	posted      *outgoing         // the post that will take pending
	postedAt    time.Time
}

// pendingPool recycles the outboxes' queues: a post that took one puts it
// back once its batch is built.
var pendingPool = sync.Pool{New: func() any { return new([]queuedDelivery) }}

// queue adds q to grain's outbox, and posts a batch message to grain unless
// one is on its way.
func (obs *outboxes) queue(n *Node, grain *actor.PID, destination string, q queuedDelivery) {
	k := pidKey{grain.Address, grain.Id}
	now := time.Now()
	var post, stale *outgoing
	obs.mu.Lock()
	ob := obs.m[k]
	if ob == nil {
		ob = &outbox{key: k, destination: destination}
		obs.m[k] = ob
	}
	if ob.pending == nil {
		ob.pending = pendingPool.Get().(*[]queuedDelivery)
	}
	*ob.pending = append(*ob.pending, q)
	if ob.posted == nil || now.Sub(ob.postedAt) >= stalledPost {
		post, stale = &outgoing{n: n, box: ob}, ob.posted
		post.call = n.calls.beginPost(grain.Address, post)
		ob.posted, ob.postedAt = post, now
	}
	obs.mu.Unlock()
	if post == nil {
		return
	}
	if stale != nil {
		n.calls.end(stale.call)
	}
	// The post wakes the endpoint writer (or the grain), which would run
	// next on this thread and take a batch of one while the callers that
	// the same answers made runnable wait behind it. Let them queue first;
	// when nothing else is runnable this returns at once.
	runtime.Gosched()
	self := n.PID()
	n.system.Root.RequestWithCustomSender(grain, post, &actor.PID{Address: self.Address, Id: self.Id, RequestId: post.call})
}

// take empties o's outbox; it is no longer posted if o was its post. The
// queue it returns, if not nil, goes back to pendingPool after use.
func (obs *outboxes) take(o *outgoing) *[]queuedDelivery {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	ob := o.box
	taken := ob.pending
	ob.pending = nil
	if ob.posted == o {
		ob.posted = nil
		if obs.m[ob.key] == ob {
			delete(obs.m, ob.key)
		}
	}
	return taken
}

// abandon gives up o, which will not be taken (it came back as a dead
// letter, or its grain stopped with o in its mailbox): if o was its outbox's
// post, the outbox goes and what it held is returned, never sent.
func (obs *outboxes) abandon(o *outgoing) []queuedDelivery {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	ob := o.box
	if ob.posted != o {
		return nil
	}
	if obs.m[ob.key] == ob {
		delete(obs.m, ob.key)
	}
	ob.posted = nil
	taken := ob.pending
	ob.pending = nil
	if taken == nil {
		return nil
	}
	return *taken
}

// cut removes the outboxes to grains on address (a member that left or
// whose connection was lost) or, with an empty address, all; what they
// held is answered by calls.failMember.
func (obs *outboxes) cut(address string) {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for k, ob := range obs.m {
		if address == "" || k.address == address {
			delete(obs.m, k)
			ob.posted = nil
			ob.pending = nil
		}
	}
}

// abandonGrain gives up the post to grain, a grain of this member that is
// stopping (protoactor drops what reaches it then): its call ends, and what
// its outbox held is returned, never sent.
func (obs *outboxes) abandonGrain(n *Node, grain *actor.PID) []queuedDelivery {
	obs.mu.Lock()
	ob := obs.m[pidKey{grain.Address, grain.Id}]
	var post *outgoing
	if ob != nil {
		post = ob.posted
	}
	obs.mu.Unlock()
	if post == nil {
		return nil
	}
	n.calls.end(post.call)
	return obs.abandon(post)
}

// outgoing is a batch message posted to a grain: it carries what its
// outbox holds when it is written (or, to a grain on the same member,
// received).
type outgoing struct {
	n    *Node
	box  *outbox
	call uint32 // the RequestId of its sender PID
}

// take is the batch o carries, emptying its outbox; a delivery whose
// caller stopped waiting, or whose deadline passed, stays out.
func (o *outgoing) take() *clusterpb.DeliverBatch {
	n := o.n
	now := time.Now()
	p := n.outboxes.take(o)
	var all []queuedDelivery
	if p != nil {
		all = *p
	}
	// Even an empty batch goes through carry, which ends its call.
	queued := n.calls.carry(o.call, all, now)
	b := &clusterpb.DeliverBatch{Destination: o.box.destination, Requests: make([]*clusterpb.DeliverRequest, len(queued))}
	reqs := make([]clusterpb.DeliverRequest, len(queued))
	for i, q := range queued {
		r := &reqs[i]
		toWire(r, q.message)
		r.BudgetNanos, r.Call, r.Parent = int64(q.deadline.Sub(now)), q.call, q.parent
		b.Requests[i] = r
	}
	if p != nil {
		clear(all)
		*p = all[:0]
		pendingPool.Put(p)
	}
	return b
}

// Serialize is called by protoactor's endpoint writer as it writes o.
func (o *outgoing) Serialize() (remote.RootSerialized, error) {
	return wireBatch{o.take()}, nil
}

// LogValue keeps payloads out of logs: protoactor logs the messages it
// routes at Debug.
func (o *outgoing) LogValue() slog.Value {
	return slog.GroupValue(slog.String("destination", o.box.destination), slog.Uint64("post", uint64(o.call)))
}

// errNotDeserialized: wireBatch and wireReplies are only written; they
// arrive as their clusterpb messages.
var errNotDeserialized = errors.New("sinkbatch: a batch message in its written form was taken for a received one")

// wireBatch is a DeliverBatch in the form protoactor writes.
type wireBatch struct{ *clusterpb.DeliverBatch }

// Deserialize is never called: see errNotDeserialized.
func (wireBatch) Deserialize() (remote.RootSerializable, error) { return nil, errNotDeserialized }

// replyBoxes are an owner's answers queued for caller processes on other
// members, one box per process with a post on its way. Safe for concurrent
// use; replyBoxes.mu may be held while calls.mu is taken, never the
// reverse.
type replyBoxes struct {
	mu sync.Mutex
	m  map[pidKey]*replyBox
}

// replyBox is the answers queued for one caller process. Guarded by
// replyBoxes.mu.
type replyBox struct {
	key      pidKey
	pending  []*clusterpb.DeliverReply
	posted   *outgoingReplies
	postedAt time.Time
}

// reply sends r to the caller process to: at once to the node's own
// endpoint; in a reply box to another member's.
func (n *Node) reply(to *actor.PID, r *clusterpb.DeliverReply) {
	switch {
	case to == nil:
	case to.Address == n.system.Address() && to.Id == endpointID:
		n.onAnswer(r.Call, r)
	case to.Address == n.system.Address():
		n.system.Root.Send(to, &clusterpb.DeliverReplies{Replies: []*clusterpb.DeliverReply{r}})
	default:
		n.replies.queue(n, to, r)
	}
}

// queue adds r to the box of to, and posts a DeliverReplies to it unless
// one is on its way.
func (rbs *replyBoxes) queue(n *Node, to *actor.PID, r *clusterpb.DeliverReply) {
	k := pidKey{to.Address, to.Id}
	now := time.Now()
	var post *outgoingReplies
	rbs.mu.Lock()
	rb := rbs.m[k]
	if rb == nil {
		rb = &replyBox{key: k}
		rbs.m[k] = rb
	}
	rb.pending = append(rb.pending, r)
	var stale *outgoingReplies
	if rb.posted == nil || now.Sub(rb.postedAt) >= stalledPost {
		post, stale = &outgoingReplies{n: n, box: rb}, rb.posted
		post.call = n.calls.beginPost(to.Address, post)
		rb.posted, rb.postedAt = post, now
	}
	rbs.mu.Unlock()
	if post == nil {
		return
	}
	if stale != nil {
		n.calls.end(stale.call)
	}
	self := n.PID()
	n.system.Root.RequestWithCustomSender(actor.NewPID(k.address, k.id), post,
		&actor.PID{Address: self.Address, Id: self.Id, RequestId: post.call})
}

// take empties o's box; it is no longer posted if o was its post.
func (rbs *replyBoxes) take(o *outgoingReplies) []*clusterpb.DeliverReply {
	rbs.mu.Lock()
	defer rbs.mu.Unlock()
	rb := o.box
	taken := rb.pending
	rb.pending = nil
	if rb.posted == o {
		rb.posted = nil
		if rbs.m[rb.key] == rb {
			delete(rbs.m, rb.key)
		}
	}
	return taken
}

// abandon gives up o, which came back as a dead letter before it was
// written: the caller's member cannot be reached, and the answers its box
// held are dropped (their callers are answered ErrUnreachable).
func (rbs *replyBoxes) abandon(o *outgoingReplies) {
	rbs.mu.Lock()
	defer rbs.mu.Unlock()
	rb := o.box
	if rb.posted != o {
		return
	}
	if rbs.m[rb.key] == rb {
		delete(rbs.m, rb.key)
	}
	rb.posted = nil
	rb.pending = nil
}

// cut drops the boxes to processes on address or, with an empty address,
// all.
func (rbs *replyBoxes) cut(address string) {
	rbs.mu.Lock()
	defer rbs.mu.Unlock()
	for k, rb := range rbs.m {
		if address == "" || k.address == address {
			delete(rbs.m, k)
			rb.posted = nil
			rb.pending = nil
		}
	}
}

// outgoingReplies is a DeliverReplies posted to a caller process on another
// member: it carries what its box holds when it is written.
type outgoingReplies struct {
	n    *Node
	box  *replyBox
	call uint32
}

// Serialize is called by protoactor's endpoint writer as it writes o.
func (o *outgoingReplies) Serialize() (remote.RootSerialized, error) {
	replies := o.n.replies.take(o)
	o.n.calls.end(o.call)
	return wireReplies{&clusterpb.DeliverReplies{Replies: replies}}, nil
}

// LogValue names the post, not its content.
func (o *outgoingReplies) LogValue() slog.Value {
	return slog.GroupValue(slog.String("to", o.box.key.address), slog.Uint64("post", uint64(o.call)))
}

// wireReplies is a DeliverReplies in the form protoactor writes.
type wireReplies struct{ *clusterpb.DeliverReplies }

// Deserialize is never called: see errNotDeserialized.
func (wireReplies) Deserialize() (remote.RootSerializable, error) { return nil, errNotDeserialized }

// onAnswer takes the answer to call id: a reply, a dead letter, an
// activation response. A post that came back as a dead letter before it
// was written is given up: the deliveries its outbox held are answered
// with the dead letter (never sent, so not admitted).
func (n *Node) onAnswer(id uint32, msg any) {
	post, taken := n.calls.answer(id, msg)
	if post == nil || taken {
		return
	}
	switch p := post.(type) {
	case *outgoing:
		n.calls.failQueued(n.outboxes.abandon(p), msg)
	case *outgoingReplies:
		n.replies.abandon(p)
	}
}
