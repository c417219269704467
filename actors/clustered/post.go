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
// seen sooner (Node.onCut, Node.onTopology). A post taken after it was
// replaced takes nothing and goes as an empty batch.
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

// boxes are items queued for processes, one box per process with a post
// (a P) on its way to it: a node's deliveries for grains (outboxes), an
// owner's answers for caller processes (replyBoxes). Safe for concurrent
// use; boxes.mu may be held while calls.mu is taken, never the reverse.
//
// To another member, one post is on its way at a time (the gate), and a
// post takes at most budget bytes: protoactor's endpoint writer puts all
// its mailbox holds into one gRPC message, and the receiving member refuses
// one above its limit (gRPC's default is 4 MiB) by dropping the connection,
// and with it every delivery and answer on it. A box with items and no
// post waits for the gate: taking a post opens it for the next box.
type boxes[T any, P comparable] struct {
	mu   sync.Mutex
	m    map[pidKey]*box[T, P] // guarded by mu
	gate map[string]gated[P]   // by address: the post on its way there; guarded by mu

	// Set by New, read-only after it.
	// pool, if set, recycles the boxes' queues: a post that took one puts
	// it back (recycle) once it has used it.
	pool *sync.Pool
	// size is an item's bytes on the wire, at most; budget the most a post
	// to another member takes (it takes one item at least).
	size   func(T) int
	budget int
	// newPost makes a post for a box (called under mu).
	newPost func(*box[T, P]) P
}

// gated is the post on its way to an address, and since when.
type gated[P comparable] struct {
	post P
	at   time.Time
}

// box is the items queued for one process. Guarded by boxes.mu.
type box[T any, P comparable] struct {
	key      pidKey
	pending  []T
	posted   P // the post that will take pending; zero: none
	postedAt time.Time
	remote   bool   // on another member: behind the gate
	label    string // what its posts carry besides the items: an outbox's destination
	taken    uint64 // items its posts took so far (see boxes.mark)
}

// add queues item in k's box (remote: on another member; label: see box),
// and makes a post for it unless one is on its way and not stalled, or the
// gate to k's member is closed; it returns that post, if any, with the
// stalled post it replaces, if any.
func (bs *boxes[T, P]) add(k pidKey, remote bool, label string, item T, now time.Time) (post, stale P, made bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.m[k]
	if b == nil {
		b = &box[T, P]{key: k, remote: remote, label: label}
		bs.m[k] = b
	}
	if b.pending == nil && bs.pool != nil {
		b.pending = (*bs.pool.Get().(*[]T))[:0]
	}
	b.pending = append(b.pending, item)
	if !bs.needsPost(b, now) || bs.closed(b, now) {
		var zero P
		return zero, zero, false
	}
	post, stale = bs.post(b, now)
	return post, stale, true
}

// needsPost: b has items, and no post on its way that is not stalled.
func (bs *boxes[T, P]) needsPost(b *box[T, P], now time.Time) bool {
	var zero P
	return len(b.pending) > 0 && (b.posted == zero || now.Sub(b.postedAt) >= stalledPost)
}

// closed: another post, not stalled, is on its way to b's member.
func (bs *boxes[T, P]) closed(b *box[T, P], now time.Time) bool {
	if !b.remote {
		return false
	}
	g, ok := bs.gate[b.key.address]
	return ok && g.post != b.posted && now.Sub(g.at) < stalledPost
}

// post makes b's post, which takes the gate to its member; it returns the
// post and the stalled one it replaces, if any.
func (bs *boxes[T, P]) post(b *box[T, P], now time.Time) (post, stale P) {
	post, stale = bs.newPost(b), b.posted
	b.posted, b.postedAt = post, now
	if b.remote {
		if bs.gate == nil {
			bs.gate = map[string]gated[P]{}
		}
		bs.gate[b.key.address] = gated[P]{post: post, at: now}
	}
	return post, stale
}

// take empties b, or takes of it as much as budget allows if capped, if o
// is its post; b is then no longer posted. If o held the gate, the gate opens
// for the next box to that member that waits for a post, whose post (and
// the stalled one it replaces) take returns for the caller to send.
func (bs *boxes[T, P]) take(b *box[T, P], o P, capped bool, now time.Time) (taken []T, next, stale P) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b.posted != o {
		// A stalled post, replaced: the post that replaced it, behind it
		// in the same mailbox, takes the box, so that one post carries it
		// (and one budget's worth goes to the member at once).
		return nil, next, stale
	}
	taken = b.pending
	b.pending = nil
	if capped && bs.budget > 0 && len(taken) > 1 {
		n, bytes := 1, bs.size(taken[0])
		for n < len(taken) {
			if bytes += bs.size(taken[n]); bytes > bs.budget {
				break
			}
			n++
		}
		if n < len(taken) {
			// The rest stays, in a queue of its own: taken goes back to
			// the pool once used.
			rest := taken[n:]
			if bs.pool != nil {
				b.pending = append((*bs.pool.Get().(*[]T))[:0], rest...)
			} else {
				b.pending = append([]T(nil), rest...)
			}
			clear(rest)
			taken = taken[:n]
		}
	}
	b.taken += uint64(len(taken))
	var zero P
	b.posted = zero
	if len(b.pending) == 0 && bs.m[b.key] == b {
		delete(bs.m, b.key)
	}
	next, stale = bs.open(b, o, now)
	return taken, next, stale
}

// open: if o, given up or taken, held the gate to b's member, the gate
// opens, and the next box to that member that needs a post (b last) gets
// one, which it returns with the stalled post it replaces.
func (bs *boxes[T, P]) open(b *box[T, P], o P, now time.Time) (next, stale P) {
	var zero P
	if !b.remote {
		return zero, zero
	}
	if g, ok := bs.gate[b.key.address]; !ok || g.post != o {
		return zero, zero
	}
	delete(bs.gate, b.key.address)
	var waiting *box[T, P]
	for _, w := range bs.m {
		if w.remote && w.key.address == b.key.address && bs.needsPost(w, now) {
			waiting = w
			if w != b {
				break
			}
		}
	}
	if waiting == nil {
		return zero, zero
	}
	return bs.post(waiting, now)
}

// recycle gives a queue take returned back to the pool, once used.
func (bs *boxes[T, P]) recycle(q []T) {
	if bs.pool != nil && q != nil {
		clear(q)
		q = q[:0]
		bs.pool.Put(&q)
	}
}

// abandon gives up o, which will not be taken: if o was its box's post, the
// box goes and what it held is returned, never sent. Like take, it returns
// the next post to b's member, if o held the gate.
func (bs *boxes[T, P]) abandon(b *box[T, P], o P, now time.Time) (gone []T, next, stale P) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b.posted != o {
		return nil, next, stale
	}
	if bs.m[b.key] == b {
		delete(bs.m, b.key)
	}
	var zero P
	b.posted = zero
	gone = b.pending
	b.pending = nil
	next, stale = bs.open(b, o, now)
	return gone, next, stale
}

// cut removes the boxes for processes on address (a member that left or
// whose connection was lost) or, with an empty address, all; the calls of
// what they held are answered by calls.failMember.
func (bs *boxes[T, P]) cut(address string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var zero P
	for k, b := range bs.m {
		if address == "" || k.address == address {
			delete(bs.m, k)
			b.posted = zero
			b.pending = nil
		}
	}
	for a := range bs.gate {
		if address == "" || a == address {
			delete(bs.gate, a)
		}
	}
}

// mark is where the items queued now end: for each box with items, how
// many its posts will have taken once they took the last of them.
func (bs *boxes[T, P]) mark() map[*box[T, P]]uint64 {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	m := make(map[*box[T, P]]uint64, len(bs.m))
	for _, b := range bs.m {
		if len(b.pending) > 0 {
			m[b] = b.taken + uint64(len(b.pending))
		}
	}
	return m
}

// gone reports whether every item queued at mark has left its box: taken
// by a post (to another member: serialized by protoactor's endpoint
// writer, so a message sent to that member from now on goes behind it), or
// dropped with its box (abandon, cut). A box leaves the map once empty or
// dropped.
func (bs *boxes[T, P]) gone(mark map[*box[T, P]]uint64) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for b, end := range mark {
		if bs.m[b.key] == b && b.taken < end {
			return false
		}
	}
	return true
}

// postedTo is the post on its way to k, if any.
func (bs *boxes[T, P]) postedTo(k pidKey) P {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var zero P
	if b := bs.m[k]; b != nil {
		return b.posted
	}
	return zero
}

// outboxes are a node's deliveries queued for grains.
type outboxes = boxes[queuedDelivery, *outgoing]

// outbox is the deliveries queued for one grain.
type outbox = box[queuedDelivery, *outgoing]

// queueDelivery adds q to grain's outbox, and posts a batch message to
// grain unless one is on its way (or, to another member, the gate is
// closed).
func (n *Node) queueDelivery(grain *actor.PID, destination string, q queuedDelivery) {
	remote := grain.Address != n.system.Address()
	post, stale, made := n.outboxes.add(pidKey{grain.Address, grain.Id}, remote, destination, q, time.Now())
	if !made {
		return
	}
	// The post wakes the endpoint writer (or the grain), which would run
	// next on this thread and take a batch of one while the callers that
	// the same answers made runnable wait behind it. Let them queue first;
	// when nothing else is runnable this returns at once.
	runtime.Gosched()
	sendPost(n, post, stale)
}

// sendable is what sendPost needs of a post: its process and call number.
type sendable interface {
	comparable
	to() pidKey
	id() uint32
}

// sendPost sends p to its process (a grain, or a caller process for
// answers), ending the call of the stalled post it replaces, if any. A nil
// p is nothing to send.
func sendPost[P sendable](n *Node, p, stale P) {
	var zero P
	if stale != zero {
		n.calls.end(stale.id())
	}
	if p == zero {
		return
	}
	k, self := p.to(), n.answersTo()
	n.system.Root.RequestWithCustomSender(actor.NewPID(k.address, k.id), p,
		&actor.PID{Address: self.Address, Id: self.Id, RequestId: p.id()})
}

// abandonGrain gives up the post to grain, a grain of this member that is
// stopping (protoactor drops what reaches it then): its call ends, and what
// its outbox held is returned, never sent.
func (n *Node) abandonGrain(grain *actor.PID) []queuedDelivery {
	post := n.outboxes.postedTo(pidKey{grain.Address, grain.Id})
	if post == nil {
		return nil
	}
	n.calls.end(post.call)
	gone, next, stale := n.outboxes.abandon(post.box, post, time.Now())
	sendPost(n, next, stale)
	return gone
}

// newOutgoing is the next post of an outbox.
func (n *Node) newOutgoing(ob *outbox) *outgoing {
	post := &outgoing{n: n, box: ob, destination: ob.label}
	post.call = n.calls.beginPost(&postCall{target: ob.key.address, deliveries: post})
	return post
}

// outgoing is a batch message posted to a grain: it carries what its
// outbox holds when it is written (or, to a grain on the same member,
// received). Its fields are set as it is made, read-only after.
type outgoing struct {
	n           *Node
	box         *outbox
	destination string
	call        uint32 // the RequestId of its sender PID
}

func (o *outgoing) to() pidKey { return o.box.key }
func (o *outgoing) id() uint32 { return o.call }

// take is the batch o carries, emptying its outbox (to another member, as
// much of it as a post's budget allows; the rest goes in the next post); a
// delivery whose caller stopped waiting, or whose deadline passed, stays
// out.
func (o *outgoing) take() *clusterpb.DeliverBatch {
	n := o.n
	now := time.Now()
	all, next, stale := n.outboxes.take(o.box, o, o.box.remote, now)
	sendPost(n, next, stale)
	// Even an empty batch goes through carry, which ends its call.
	queued := n.calls.carry(o.call, all, now)
	b := &clusterpb.DeliverBatch{Destination: o.destination, Requests: make([]*clusterpb.DeliverRequest, len(queued))}
	reqs := make([]clusterpb.DeliverRequest, len(queued))
	for i, q := range queued {
		r := &reqs[i]
		toWire(r, q.message)
		r.BudgetNanos, r.Call, r.Parent = int64(q.deadline.Sub(now)), q.call, q.parent
		b.Requests[i] = r
	}
	n.outboxes.recycle(all)
	return b
}

// Serialize is called by protoactor's endpoint writer as it writes o.
func (o *outgoing) Serialize() (remote.RootSerialized, error) {
	return wireBatch{o.take()}, nil
}

// LogValue keeps payloads out of logs: protoactor logs the messages it
// routes at Debug.
func (o *outgoing) LogValue() slog.Value {
	return slog.GroupValue(slog.String("destination", o.destination), slog.Uint64("post", uint64(o.call)))
}

// errNotDeserialized: wireBatch and wireReplies are only written; they
// arrive as their clusterpb messages.
var errNotDeserialized = errors.New("sinkbatch: a batch message in its written form was taken for a received one")

// wireBatch is a DeliverBatch in the form protoactor writes.
type wireBatch struct{ *clusterpb.DeliverBatch }

// Deserialize is never called: see errNotDeserialized.
func (wireBatch) Deserialize() (remote.RootSerializable, error) { return nil, errNotDeserialized }

// replyBoxes are an owner's answers queued for caller processes on other
// members.
type replyBoxes = boxes[*clusterpb.DeliverReply, *outgoingReplies]

// replyBox is the answers queued for one caller process.
type replyBox = box[*clusterpb.DeliverReply, *outgoingReplies]

// reply sends r to the caller process to: at once to the node's own
// endpoint; in a reply box to another member's.
func (n *Node) reply(to *actor.PID, r *clusterpb.DeliverReply) {
	switch {
	case to == nil:
	case to.Address == n.system.Address() && (to.Id == n.replyID || to.Id == endpointID):
		n.calls.reply(r)
	case to.Address == n.system.Address():
		n.system.Root.Send(to, &clusterpb.DeliverReplies{Replies: []*clusterpb.DeliverReply{r}})
	default:
		n.queueReply(to, r)
	}
}

// queueReply adds r to the box of to, and posts a DeliverReplies to it
// unless one is on its way (or the gate to its member is closed).
func (n *Node) queueReply(to *actor.PID, r *clusterpb.DeliverReply) {
	post, stale, made := n.replies.add(pidKey{to.Address, to.Id}, true, "", r, time.Now())
	if made {
		sendPost(n, post, stale)
	}
}

// newOutgoingReplies is the next post of a reply box.
func (n *Node) newOutgoingReplies(rb *replyBox) *outgoingReplies {
	post := &outgoingReplies{n: n, box: rb}
	post.call = n.calls.beginPost(&postCall{target: rb.key.address, replies: post})
	return post
}

// outgoingReplies is a DeliverReplies posted to a caller process on another
// member: it carries what its box holds when it is written, as much as a
// post's budget allows. Its fields are set as it is made, read-only after.
type outgoingReplies struct {
	n    *Node
	box  *replyBox
	call uint32
}

func (o *outgoingReplies) to() pidKey { return o.box.key }
func (o *outgoingReplies) id() uint32 { return o.call }

// Serialize is called by protoactor's endpoint writer as it writes o.
func (o *outgoingReplies) Serialize() (remote.RootSerialized, error) {
	replies, next, stale := o.n.replies.take(o.box, o, true, time.Now())
	o.n.calls.end(o.call)
	sendPost(o.n, next, stale)
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

// onDeadLetter takes a dead letter for call id (a request or a post that
// did not reach its process). A post that came back before it was written
// is given up: the deliveries its outbox held are answered notSent (never
// sent, so not admitted); the answers a reply box held are dropped, as
// their callers' member cannot be reached (its callers are answered
// ErrUnreachable there).
func (n *Node) onDeadLetter(id uint32) {
	p := n.calls.deadLetter(id)
	switch {
	case p == nil:
	case p.deliveries != nil:
		gone, next, stale := n.outboxes.abandon(p.deliveries.box, p.deliveries, time.Now())
		n.calls.failQueued(gone, notSent)
		sendPost(n, next, stale)
	case p.replies != nil:
		_, next, stale := n.replies.abandon(p.replies.box, p.replies, time.Now())
		sendPost(n, next, stale)
	}
}

// pendingPool recycles the outboxes' queues.
var pendingPool = sync.Pool{New: func() any { return new([]queuedDelivery) }}
