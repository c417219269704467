package clustered

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// Backoff between attempts to reach a destination's owner, while ownership
// moves: full jitter, doubling from minBackoff up to maxBackoff.
const (
	minBackoff = 2 * time.Millisecond
	maxBackoff = 100 * time.Millisecond
)

// errLeavingOwner answers a caller of a member that is leaving whose
// destination the member owns: it was not admitted, and cannot be until
// the member has left.
var errLeavingOwner = fmt.Errorf("%w: the member is leaving the cluster and owns the destination; the message was not sent", messages.ErrStopped)

// memberLeft answers a call whose target left the cluster: a request or a
// delivery that may have reached it.
type memberLeft struct{}

// notSent answers a delivery that was never written to its owner: it waited
// in an outbox whose owner left, or whose batch message came back as a dead
// letter before it was written.
type notSent struct{}

// nodeQuit answers every call that waits, or begins, once Leave gave up
// waiting (calls.failAll): nothing will answer it any more. unsent: it is a
// delivery that was never written (still queued, or begun after that).
type nodeQuit struct{ unsent bool }

// answeredHere answers a delivery admitted directly (Node.here): its
// result is in its call.
type answeredHere struct{}

// calls are a node's requests and deliveries waiting for an answer, and
// the batch messages it posted, each told apart by a number: the RequestId
// of the sender PID a request or a post hands out (the endpoint's PID), or
// the call of a DeliverRequest. Safe for concurrent use.
type calls struct {
	mu  sync.Mutex
	seq uint32
	m   map[uint32]*call
	// quit: failAll ran. A call that begins then is answered nodeQuit at
	// once, so that waiting for an answer needs no channel shared by every
	// caller (a select locks each of its channels: one shared by all
	// callers is a lock they all contend for).
	quit bool
}

// call is one request, delivery or post waiting for its answer.
type call struct {
	target string // the member it was sent to
	// answer receives exactly one answer; nil for a post.
	answer chan any

	// A delivery is queued in an outbox until a batch takes it; batch is
	// then that batch's call, registered under batchID.
	queued  bool
	batch   *call
	batchID uint32

	// A post is an *outgoing or an *outgoingReplies. A batch that was
	// taken keeps the calls of the deliveries it carries (left of them
	// still wait), for its dead letter to answer; it ends when one of them
	// is answered with a DeliverReply (the batch reached its grain, so no
	// dead letter will follow) or when none waits any more.
	post    any
	taken   bool
	carried []uint32
	left    int

	// timer keeps the deadline of the caller waiting on answer.
	timer *time.Timer
	// grain: a delivery's, told if its caller cancels once it was written.
	grain *actor.PID

	// A delivery admitted directly (Node.here) is in directCalls, not in
	// calls: result is its answer, set before answeredHere is sent on
	// answer; pending is its token while it waits, 0 once answered or
	// abandoned; token counts the deliveries c served, so that an answer
	// meant for an earlier one is told apart.
	result  codec.Result
	pending atomic.Uint64
	token   uint64
	shard   uint8
	prev    *call
	next    *call
}

// callPool recycles the calls of requests and deliveries, answer channel
// included: one is put back only once nobody can send on its channel any
// more (see Node.wait).
var callPool = sync.Pool{New: func() any { return &call{answer: make(chan any, 1)} }}

// newCall is a call to target from callPool.
func newCall(target string, queued bool) *call {
	c := callPool.Get().(*call)
	c.target, c.queued = target, queued
	return c
}

// recycle puts c back in callPool; its answer was taken, or will never be
// sent.
func recycle(c *call) {
	c.target, c.queued, c.batch, c.batchID, c.result, c.grain = "", false, nil, 0, codec.Result{}, nil
	callPool.Put(c)
}

// add registers c and returns its number; after failAll, c is answered
// nodeQuit at once instead. cs.mu must be held.
func (cs *calls) add(c *call) uint32 {
	if cs.quit {
		if c.answer != nil {
			c.answer <- nodeQuit{unsent: true}
		}
		return 0
	}
	for {
		cs.seq++
		if _, taken := cs.m[cs.seq]; cs.seq != 0 && !taken {
			cs.m[cs.seq] = c
			return cs.seq
		}
	}
}

// begin registers a request to target and returns its number.
func (cs *calls) begin(target string) (uint32, *call) {
	c := newCall(target, false)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(c), c
}

// beginDelivery registers a delivery to target, about to be queued in an
// outbox, and returns its number.
func (cs *calls) beginDelivery(target string) (uint32, *call) {
	c := newCall(target, true)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(c), c
}

// beginPost registers post, about to be sent to target, and returns its
// number: the RequestId of its sender PID, under which a dead letter for it
// comes back.
func (cs *calls) beginPost(target string, post any) uint32 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(&call{target: target, post: post})
}

// answer ends call id with msg, if it still waits. For a post it returns
// the post and whether it was taken, answering (taken) the deliveries it
// carried with msg.
func (cs *calls) answer(id uint32, msg any) (post any, taken bool) {
	cs.mu.Lock()
	c := cs.m[id]
	if c == nil {
		cs.mu.Unlock()
		return nil, false
	}
	delete(cs.m, id)
	if c.post != nil {
		var waiting []*call
		for _, d := range c.carried {
			if dc := cs.m[d]; dc != nil && dc.batch == c {
				delete(cs.m, d)
				waiting = append(waiting, dc)
			}
		}
		cs.mu.Unlock()
		for _, w := range waiting {
			w.answer <- msg
		}
		return c.post, c.taken
	}
	if c.batch != nil {
		if _, reached := msg.(*clusterpb.DeliverReply); reached {
			cs.endBatch(c)
		} else {
			cs.release(c)
		}
	}
	cs.mu.Unlock()
	c.answer <- msg
	return nil, false
}

// endBatch ends the batch delivery c went in. cs.mu must be held.
func (cs *calls) endBatch(c *call) {
	if cs.m[c.batchID] == c.batch {
		delete(cs.m, c.batchID)
	}
}

// release counts out delivery c from its batch, which ends once none of
// its deliveries waits. cs.mu must be held.
func (cs *calls) release(c *call) {
	if c.batch == nil {
		return
	}
	c.batch.left--
	if c.batch.left <= 0 {
		cs.endBatch(c)
	}
}

// end forgets call id, whose caller stopped waiting. It reports whether
// the call still waited (if not, its answer is on its way) and whether it
// had been written (a delivery no longer queued; any other call).
func (cs *calls) end(id uint32) (waited, written bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[id]
	if c == nil {
		return false, false
	}
	delete(cs.m, id)
	cs.release(c)
	return true, !c.queued
}

// carry records that batch id takes queued, dropping (in place) the
// deliveries whose caller stopped waiting or whose deadline passed by now:
// they are not sent. It returns those it carries.
func (cs *calls) carry(id uint32, queued []queuedDelivery, now time.Time) []queuedDelivery {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	b := cs.m[id]
	if b != nil {
		b.taken = true
	}
	kept := queued[:0]
	for _, q := range queued {
		c := cs.m[q.call]
		if c == nil || !c.queued || !q.deadline.After(now) {
			continue
		}
		c.queued = false
		if b != nil {
			c.batch, c.batchID = b, id
			b.carried = append(b.carried, q.call)
			b.left++
		}
		kept = append(kept, q)
	}
	if b != nil && b.left == 0 {
		delete(cs.m, id)
	}
	return kept
}

// failQueued answers with msg the deliveries of queued still waiting in an
// outbox.
func (cs *calls) failQueued(queued []queuedDelivery, msg any) {
	var waiting []*call
	cs.mu.Lock()
	for _, q := range queued {
		if c := cs.m[q.call]; c != nil && c.queued {
			delete(cs.m, q.call)
			waiting = append(waiting, c)
		}
	}
	cs.mu.Unlock()
	for _, c := range waiting {
		c.answer <- msg
	}
}

// failMember answers every call to address: notSent for a delivery still
// queued, memberLeft for the rest (notSent too if graceful: the member
// said it admits nothing more); posts to it are forgotten.
func (cs *calls) failMember(address string, graceful bool) {
	cs.fail(func(c *call) bool { return c.target == address }, graceful)
}

// failAll answers every call nodeQuit, now and from now on.
func (cs *calls) failAll() {
	cs.mu.Lock()
	cs.quit = true
	cs.mu.Unlock()
	cs.fail(func(*call) bool { return true }, false)
}

func (cs *calls) fail(match func(*call) bool, graceful bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for id, c := range cs.m {
		if !match(c) {
			continue
		}
		delete(cs.m, id)
		switch {
		case c.answer == nil:
		case cs.quit:
			c.answer <- nodeQuit{unsent: c.queued}
		case c.queued, graceful:
			c.answer <- notSent{}
		default:
			c.answer <- memberLeft{}
		}
	}
}

// pidCache holds the grain PID each destination was last resolved to.
// Safe for concurrent use.
type pidCache struct {
	mu sync.RWMutex
	m  map[string]*actor.PID
}

func (p *pidCache) get(destination string) *actor.PID {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.m[destination]
}

func (p *pidCache) put(destination string, pid *actor.PID) {
	p.mu.Lock()
	p.m[destination] = pid
	p.mu.Unlock()
}

// forget drops destination's entry if it is still pid.
func (p *pidCache) forget(destination string, pid *actor.PID) {
	p.mu.Lock()
	if cur := p.m[destination]; cur != nil && cur.Equal(pid) {
		delete(p.m, destination)
	}
	p.mu.Unlock()
}

func (p *pidCache) clear() {
	p.mu.Lock()
	clear(p.m)
	p.mu.Unlock()
}

// DeliverResult is Deliver returning the destination's whole answer for m:
// its message id and, where the destination assigns one, its sequence
// number.
func (n *Node) DeliverResult(ctx context.Context, destination string, m codec.Message) (codec.Result, error) {
	if ctx == nil {
		return codec.Result{}, actors.ErrNilContext
	}
	if !n.inflight.enter() {
		return codec.Result{}, messages.ErrStopped
	}
	defer n.inflight.exit()
	return n.deliver(ctx, destination, m, nil)
}

// deliver is DeliverResult for a caller counted in n.inflight.
//
// An attempt that the owner did not admit (it is not the owner, it is
// handing the destination off, the grain is gone, the member cannot be
// dialled) is made again after a backoff, to the owner resolved anew, until
// the deadline. An attempt that may have been admitted is never made again:
// its silence until the deadline, or its member leaving the cluster, is
// ErrUnreachable.
//
// queued, if not nil, is called once, as soon as the first attempt is
// queued for its owner (in an outbox, or in the local instance's mailbox)
// or deliver returns, whichever comes first: the actor form makes one
// sender's next delivery of a group then (see Node.deliverFor).
func (n *Node) deliver(ctx context.Context, destination string, m codec.Message, queued func()) (codec.Result, error) {
	if queued != nil {
		once := queued
		queued = func() {
			if once != nil {
				once()
				once = nil
			}
		}
		defer queued()
	}
	if _, ok := n.cfg.Destinations[destination]; !ok {
		return codec.Result{}, fmt.Errorf("%w %s", ErrUnknownDestination, clipName(destination))
	}
	if err := ctx.Err(); err != nil {
		return codec.Result{}, err
	}
	// The deadline is kept by the waits' own timers, not by ctx's Done
	// alone: a ctx of the caller's making can report a deadline its Done
	// never keeps.
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(actors.DefaultTimeout)
	}
	q := queuedDelivery{deadline: deadline, message: m, parent: spanToWire(trace.SpanContextFromContext(ctx))}
	// Refused wherever its caller is, so that the answer does not depend
	// on which member owns the destination.
	if size, most := wireSize(q), n.outboxes.budget; size > most {
		return codec.Result{}, fmt.Errorf("%w: %d bytes (body, strings and attributes) cannot cross between cluster members, which take at most %d (half of Config.MaxWireBytes)", codec.ErrTooLarge, size, most)
	}
	backoff := minBackoff
	for {
		if r, admitted, err := n.here(ctx, deadline, destination, m, queued); admitted {
			return r, err
		}
		pid, err := n.resolve(ctx, deadline, destination)
		if err != nil {
			return codec.Result{}, err
		}
		if pid != nil {
			if time.Until(deadline) <= 0 {
				return codec.Result{}, n.unreachable(ctx)
			}
			answer, err := n.sendQueued(ctx, deadline, pid, destination, q, queued)
			if err != nil {
				return codec.Result{}, err
			}
			switch a := answer.(type) {
			case *clusterpb.DeliverReply:
				if !a.NotOwner {
					if a.Error != nil {
						return codec.Result{}, decodeError(a.Error)
					}
					return codec.Result{ID: a.Id, Sequence: a.Sequence}, nil
				}
			case *actor.DeadLetterResponse, notSent:
				// Not delivered, so not admitted.
			case memberLeft:
				return codec.Result{}, fmt.Errorf("%w: its member left the cluster before answering", ErrUnreachable)
			case nodeQuit:
				if a.unsent {
					return codec.Result{}, errQuitUnsent
				}
				return codec.Result{}, errNodeQuit
			}
			n.cache.forget(destination, pid)
		}
		if n.leaving.Load() && n.topo.owner(destination) == n.system.Address() {
			// This member stopped admitting, and its topology names it
			// the owner until Leave is done, which waits for this call:
			// no attempt can be admitted before then.
			return codec.Result{}, errLeavingOwner
		}
		if err := n.pause(ctx, deadline, backoff); err != nil {
			return codec.Result{}, err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// here delivers m straight to the member's own instance, if this member
// owns destination in the latest topology and its grain admits there
// (ledger.admitHere): no outbox, no grain, no wire. admitted is false if
// it did not; the caller then goes through the grain. Once admitted, the
// delivery is answered as if the grain had admitted it: with the
// instance's answer, or ErrUnreachable if the ctx ends or Leave gives up
// first.
func (n *Node) here(ctx context.Context, deadline time.Time, destination string, m codec.Message, queued func()) (r codec.Result, admitted bool, err error) {
	if n.leaving.Load() || !n.lease.holds() {
		return codec.Result{}, false, nil
	}
	h, undo := n.ledger.admitHere(destination, n.topo.version.Load())
	if h == nil {
		n.apply(undo)
		return codec.Result{}, false, nil
	}
	c := newCall("", false) // no target: directCalls, not calls.failMember, answers it
	token, ok := n.direct.add(c)
	if !ok {
		// Leave gave up: nothing is sent.
		if !n.direct.abandon(c) {
			<-c.answer
		}
		n.direct.remove(c)
		recycle(c)
		n.apply(n.ledger.answered(h))
		return codec.Result{}, true, errQuitUnsent
	}
	a := newAdmitted()
	a.here, a.directCall, a.token = true, c, token
	n.admit(a, h, 0, messages.Deliver{
		Codec:       n.cfg.Destinations[destination],
		Message:     m,
		Deadline:    deadline,
		SpanContext: trace.SpanContextFromContext(ctx),
	})
	if queued != nil {
		queued()
	}
	answer, err := n.wait(ctx, deadline, 0, c, &r)
	if err != nil {
		return codec.Result{}, true, err
	}
	switch answer.(type) {
	case answeredHere:
		if r.Err == errUnleased {
			// Dropped unsent for want of the lease: the caller tries
			// again.
			return codec.Result{}, false, nil
		}
		if r.Err != nil {
			return codec.Result{}, true, r.Err
		}
		return r, true, nil
	case nodeQuit:
		return codec.Result{}, true, errNodeQuit
	}
	// memberLeft: this member left the cluster.
	return codec.Result{}, true, fmt.Errorf("%w: its member left the cluster before answering", ErrUnreachable)
}

// send queues one attempt of q for grain, in the batch the node sends it
// next, and waits for its answer: a reply, a dead letter, memberLeft,
// notSent, nodeQuit. A nil answer with an error means the ctx ended or the node gave
// up first.
func (n *Node) send(ctx context.Context, deadline time.Time, grain *actor.PID, destination string, q queuedDelivery) (any, error) {
	return n.sendQueued(ctx, deadline, grain, destination, q, nil)
}

// sendQueued is send calling queued, if not nil, once q is queued.
func (n *Node) sendQueued(ctx context.Context, deadline time.Time, grain *actor.PID, destination string, q queuedDelivery, queued func()) (any, error) {
	id, c := n.calls.beginDelivery(grain.Address)
	if id == 0 {
		// Leave gave up: c is answered nodeQuit, and nothing is sent.
		a := <-c.answer
		recycle(c)
		return a, nil
	}
	q.call = id
	c.grain = grain
	n.queueDelivery(grain, destination, q)
	if queued != nil {
		queued()
	}
	return n.wait(ctx, deadline, id, c, nil)
}

// unreachable is the answer to a caller whose ctx ended, or whose deadline
// passed, before its owner answered.
func (n *Node) unreachable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, context.DeadlineExceeded)
}

// pause waits a jittered d, or until ctx ends, the deadline passes or
// Leave gives up.
func (n *Node) pause(ctx context.Context, deadline time.Time, d time.Duration) error {
	left := time.Until(deadline)
	if left <= 0 {
		return n.unreachable(ctx)
	}
	d = rand.N(d) + 1
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	select {
	case <-t.C:
		if d >= left {
			return n.unreachable(ctx)
		}
		return nil
	case <-ctx.Done():
		return n.unreachable(ctx)
	case <-n.quit:
		return messages.ErrStopped
	}
}

// request sends msg to pid with the endpoint as its sender and waits for
// the answer: a reply, a dead letter, memberLeft, nodeQuit. A nil answer with an error
// means the ctx ended or the node gave up first.
func (n *Node) request(ctx context.Context, deadline time.Time, pid *actor.PID, msg any) (any, error) {
	self := n.answersTo()
	id, c := n.calls.begin(pid.Address)
	if id == 0 {
		// Leave gave up: c is answered nodeQuit, and nothing is sent.
		a := <-c.answer
		recycle(c)
		return a, nil
	}
	sender := &actor.PID{Address: self.Address, Id: self.Id, RequestId: id}
	n.system.Root.RequestWithCustomSender(pid, msg, sender)
	return n.wait(ctx, deadline, id, c, nil)
}

// timerCtx is the type of the ctx context.WithDeadline and WithTimeout
// return (unless the parent's deadline is sooner): its Done closes at its
// deadline, by a timer of its own.
var timerCtx = reflect.TypeOf(func() context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel()
	return ctx
}())

// keepsDeadline reports whether ctx's Done is sure to close by deadline: it
// is a context.WithDeadline or WithTimeout ctx whose deadline it is. Any
// other ctx (one of the caller's own making, which may report a deadline
// its Done never keeps, or one that wraps another) is given a timer of the
// call's. What this spares is that timer's Reset and Stop (each takes the
// lock of a P's timer heap) and a third channel in the wait's select.
func keepsDeadline(ctx context.Context, deadline time.Time) bool {
	if reflect.TypeOf(ctx) != timerCtx {
		return false
	}
	d, ok := ctx.Deadline()
	return ok && !d.After(deadline)
}

// errUnleased answers, in its call, a delivery admitted directly that its
// batcher dropped unsent because the node lost its lease (see
// admitted.Forgotten): Node.here tries it again.
var errUnleased = errors.New("sinkbatch: not sent: the member lost its ownership lease")

// errNodeQuit answers a caller whose call was still waiting when Leave gave
// up: its delivery may have been sent.
var errNodeQuit = fmt.Errorf("%w: the node left before its owner answered", ErrUnreachable)

// errQuitUnsent answers a caller whose delivery had not been written when
// Leave gave up: it never will be.
var errQuitUnsent = fmt.Errorf("%w: the node left before the message was sent; it was not sent", messages.ErrStopped)

// wait waits for call id's answer until ctx ends or the deadline passes,
// and recycles c. Id 0 is a delivery admitted directly, in n.direct: its
// result is copied to result. Leave giving up answers it (nodeQuit): see
// calls.quit and directCalls.fail.
func (n *Node) wait(ctx context.Context, deadline time.Time, id uint32, c *call, result *codec.Result) (any, error) {
	var err error
	if keepsDeadline(ctx, deadline) {
		select {
		case a := <-c.answer:
			if result != nil {
				*result = c.result
			}
			n.done(id, c)
			return a, nil
		case <-ctx.Done():
			err = n.unreachable(ctx)
		}
	} else {
		// c's timer is c's own: stopped before c is recycled, and (since
		// Go 1.23) a stopped timer's channel holds nothing stale.
		if c.timer == nil {
			c.timer = time.NewTimer(time.Until(deadline))
		} else {
			c.timer.Reset(time.Until(deadline))
		}
		select {
		case a := <-c.answer:
			c.timer.Stop()
			if result != nil {
				*result = c.result
			}
			n.done(id, c)
			return a, nil
		case <-c.timer.C:
			err = n.unreachable(ctx)
		case <-ctx.Done():
			err = n.unreachable(ctx)
		}
		c.timer.Stop()
	}
	switch waited, written := n.stopWaiting(id, c); {
	case !waited:
		<-c.answer
	case written && c.grain != nil && errors.Is(ctx.Err(), context.Canceled):
		// The owner may hold it: it drops it unless it was sent.
		n.cancelDelivery(c.grain, id, deadline)
	}
	n.done(id, c)
	return nil, err
}

// stopWaiting ends call id (0: c, a direct delivery), whose caller stopped
// waiting. It reports whether the call still waited (if not, its answer is
// on its way) and, if it did, whether it was written to its owner (a
// delivery no longer queued in an outbox).
func (n *Node) stopWaiting(id uint32, c *call) (waited, written bool) {
	if id == 0 {
		return n.direct.abandon(c), false
	}
	return n.calls.end(id)
}

// done recycles c, answered, of call id (0: a direct delivery, taken out
// of n.direct first).
func (n *Node) done(id uint32, c *call) {
	if id == 0 {
		n.direct.remove(c)
	}
	recycle(c)
}

// resolve is the PID of destination's grain: cached, or activated on the
// owner the latest topology names. nil with a nil error: no owner could
// be reached this time.
func (n *Node) resolve(ctx context.Context, deadline time.Time, destination string) (*actor.PID, error) {
	if pid := n.cache.get(destination); pid != nil {
		return pid, nil
	}
	owner := n.topo.owner(destination)
	if owner == "" {
		return nil, nil
	}
	answer, err := n.request(ctx, deadline, actor.NewPID(owner, disthash.PartitionActivatorActorName),
		&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: destination, Kind: Kind}})
	if err != nil {
		return nil, err
	}
	switch r := answer.(type) {
	case *cluster.ActivationResponse:
		if r.Pid != nil && !r.Failed {
			n.cache.put(destination, r.Pid)
			return r.Pid, nil
		}
	case nodeQuit:
		// Nothing was delivered, nor will be.
		return nil, messages.ErrStopped
	}
	return nil, nil
}
