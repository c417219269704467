package clustered

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
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

// pidCache holds the grain PID each destination was last resolved to.
// Safe for concurrent use.
type pidCache struct {
	mu sync.RWMutex
	m  map[string]*actor.PID // guarded by mu
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
			a, err := n.sendQueued(ctx, deadline, pid, destination, q, queued)
			if err != nil {
				return codec.Result{}, err
			}
			switch a.outcome {
			case answered:
				if r := a.reply; !r.NotOwner {
					if r.Error != nil {
						return codec.Result{}, decodeError(r.Error)
					}
					return codec.Result{ID: r.Id, Sequence: r.Sequence}, nil
				}
			case notSent:
				// Not delivered, so not admitted.
			case memberLeft:
				return codec.Result{}, fmt.Errorf("%w: its member left the cluster before answering", ErrUnreachable)
			case nodeQuit:
				return codec.Result{}, errNodeQuit
			case quitUnsent:
				return codec.Result{}, errQuitUnsent
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
	c := newDirectCall()
	token, ok := n.direct.add(c)
	if !ok {
		// Leave gave up: nothing is sent.
		if !n.direct.abandon(c) {
			<-c.answer
		}
		n.direct.remove(c)
		c.recycle()
		n.apply(n.ledger.answered(h))
		return codec.Result{}, true, errQuitUnsent
	}
	a := newAdmitted()
	a.hereCall, a.token = c, token
	n.admit(a, h, 0, messages.Deliver{
		Codec:       n.cfg.Destinations[destination],
		Message:     m,
		Deadline:    deadline,
		SpanContext: trace.SpanContextFromContext(ctx),
	})
	if queued != nil {
		queued()
	}
	answer, err := n.awaitDirect(ctx, deadline, c)
	if err != nil {
		return codec.Result{}, true, err
	}
	switch answer.outcome {
	case answered:
		r := answer.result
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
// next, and waits for its answer. A zero answer with an error means the
// ctx ended or the deadline passed first.
func (n *Node) send(ctx context.Context, deadline time.Time, grain *actor.PID, destination string, q queuedDelivery) (deliveryAnswer, error) {
	return n.sendQueued(ctx, deadline, grain, destination, q, nil)
}

// sendQueued is send calling queued, if not nil, once q is queued.
func (n *Node) sendQueued(ctx context.Context, deadline time.Time, grain *actor.PID, destination string, q queuedDelivery, queued func()) (deliveryAnswer, error) {
	id, c := n.calls.beginDelivery(grain.Address)
	if id == 0 {
		// Leave gave up: nothing is sent.
		c.recycle()
		return deliveryAnswer{outcome: quitUnsent}, nil
	}
	q.call = id
	c.grain = grain
	n.queueDelivery(grain, destination, q)
	if queued != nil {
		queued()
	}
	return n.awaitDelivery(ctx, deadline, id, c)
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
// the answer. A zero answer with an error means the ctx ended or the
// deadline passed first.
func (n *Node) request(ctx context.Context, deadline time.Time, pid *actor.PID, msg any) (requestAnswer, error) {
	self := n.answersTo()
	id, c := n.calls.beginRequest(pid.Address)
	if id == 0 {
		// Leave gave up: nothing is sent.
		return requestAnswer{outcome: quitUnsent}, nil
	}
	sender := &actor.PID{Address: self.Address, Id: self.Id, RequestId: id}
	n.system.Root.RequestWithCustomSender(pid, msg, sender)
	return n.awaitRequest(ctx, deadline, id, c)
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

// errUnleased answers, in its directAnswer's result, a delivery admitted
// directly that its batcher dropped unsent because the node lost its lease
// (see admitted.Forgotten): Node.here tries it again.
var errUnleased = errors.New("sinkbatch: not sent: the member lost its ownership lease")

// errNodeQuit answers a caller whose call was still waiting when Leave gave
// up: its delivery may have been sent.
var errNodeQuit = fmt.Errorf("%w: the node left before its owner answered", ErrUnreachable)

// errQuitUnsent answers a caller whose delivery had not been written when
// Leave gave up: it never will be.
var errQuitUnsent = fmt.Errorf("%w: the node left before the message was sent; it was not sent", messages.ErrStopped)

// await waits for the one answer on ch until ctx ends or the deadline
// passes, and returns it; or, if it gave up first, the error to answer the
// caller with. timer is the call's own (made on first use, stopped before
// await returns): a ctx that keeps the deadline itself needs none.
func await[A any](n *Node, ctx context.Context, deadline time.Time, ch <-chan A, timer **time.Timer) (A, error) {
	var none A
	if keepsDeadline(ctx, deadline) {
		select {
		case a := <-ch:
			return a, nil
		case <-ctx.Done():
			return none, n.unreachable(ctx)
		}
	}
	// Since Go 1.23 a stopped timer's channel holds nothing stale.
	if *timer == nil {
		*timer = time.NewTimer(time.Until(deadline))
	} else {
		(*timer).Reset(time.Until(deadline))
	}
	t := *timer
	defer t.Stop()
	select {
	case a := <-ch:
		return a, nil
	case <-t.C:
		return none, n.unreachable(ctx)
	case <-ctx.Done():
		return none, n.unreachable(ctx)
	}
}

// awaitDelivery waits for the answer of delivery call id (see await), and
// recycles c. A caller that stops waiting for a delivery written to its
// owner because its ctx was cancelled tells the owner, which drops it
// unless it was sent.
func (n *Node) awaitDelivery(ctx context.Context, deadline time.Time, id uint32, c *deliveryCall) (deliveryAnswer, error) {
	a, err := await(n, ctx, deadline, c.answer, &c.timer)
	if err != nil {
		switch waited, written := n.calls.end(id); {
		case !waited:
			// Its answer is on its way: taken before c is recycled.
			<-c.answer
		case written && errors.Is(ctx.Err(), context.Canceled):
			n.cancelDelivery(c.grain, id, deadline)
		}
	}
	c.recycle()
	return a, err
}

// awaitRequest waits for the answer of request call id (see await).
func (n *Node) awaitRequest(ctx context.Context, deadline time.Time, id uint32, c *requestCall) (requestAnswer, error) {
	a, err := await(n, ctx, deadline, c.answer, &c.timer)
	if err != nil {
		// An answer on its way lands in c's buffer, and is dropped with c.
		n.calls.end(id)
	}
	return a, err
}

// awaitDirect waits for the answer of c, a delivery admitted directly
// (see await), takes c out of n.direct and recycles it. Leave giving up
// answers it too (nodeQuit: see directCalls.fail).
func (n *Node) awaitDirect(ctx context.Context, deadline time.Time, c *directCall) (directAnswer, error) {
	a, err := await(n, ctx, deadline, c.answer, &c.timer)
	if err != nil && !n.direct.abandon(c) {
		// Its answer is on its way: taken before c is recycled.
		<-c.answer
	}
	n.direct.remove(c)
	c.recycle()
	return a, err
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
	a, err := n.request(ctx, deadline, actor.NewPID(owner, disthash.PartitionActivatorActorName),
		&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: destination, Kind: Kind}})
	if err != nil {
		return nil, err
	}
	switch a.outcome {
	case answered:
		if r := a.activation; r != nil && r.Pid != nil && !r.Failed {
			n.cache.put(destination, r.Pid)
			return r.Pid, nil
		}
	case nodeQuit, quitUnsent:
		// Nothing was delivered, nor will be.
		return nil, messages.ErrStopped
	}
	return nil, nil
}
