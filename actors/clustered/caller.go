package clustered

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"

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

// memberLeft answers a call whose target left the cluster.
type memberLeft struct{}

// calls are a node's requests waiting for an answer, told apart by the
// RequestId of the sender PID each one hands out (the endpoint's PID): a
// reply, a dead letter for the request, or the target leaving the
// cluster. Safe for concurrent use.
type calls struct {
	mu  sync.Mutex
	seq uint32
	m   map[uint32]*call
}

// call is one request waiting for its answer.
type call struct {
	target string   // the member it was sent to
	answer chan any // receives exactly one answer
}

// begin registers a call to target and returns its request id.
func (cs *calls) begin(target string) (uint32, *call) {
	c := &call{target: target, answer: make(chan any, 1)}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for {
		cs.seq++
		if _, taken := cs.m[cs.seq]; cs.seq != 0 && !taken {
			cs.m[cs.seq] = c
			return cs.seq, c
		}
	}
}

// answer ends call id with msg, if it still waits.
func (cs *calls) answer(id uint32, msg any) {
	cs.mu.Lock()
	c := cs.m[id]
	delete(cs.m, id)
	cs.mu.Unlock()
	if c != nil {
		c.answer <- msg
	}
}

// end forgets call id, whose caller stopped waiting.
func (cs *calls) end(id uint32) {
	cs.mu.Lock()
	delete(cs.m, id)
	cs.mu.Unlock()
}

// failMember answers every call to address with memberLeft.
func (cs *calls) failMember(address string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for id, c := range cs.m {
		if c.target == address {
			delete(cs.m, id)
			c.answer <- memberLeft{}
		}
	}
}

// failAll answers every call with memberLeft.
func (cs *calls) failAll() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for id, c := range cs.m {
		delete(cs.m, id)
		c.answer <- memberLeft{}
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
	if !n.inflight.enter() {
		return codec.Result{}, messages.ErrStopped
	}
	defer n.inflight.exit()
	return n.deliver(ctx, destination, m)
}

// deliver is DeliverResult for a caller counted in n.inflight.
//
// An attempt that the owner did not admit (it is not the owner, it is
// handing the destination off, the grain is gone, the member cannot be
// dialled) is made again after a backoff, to the owner resolved anew, until
// the deadline. An attempt that may have been admitted is never made again:
// its silence until the deadline, or its member leaving the cluster, is
// ErrUnreachable.
func (n *Node) deliver(ctx context.Context, destination string, m codec.Message) (codec.Result, error) {
	if _, ok := n.cfg.Destinations[destination]; !ok {
		return codec.Result{}, fmt.Errorf("%w %q", ErrUnknownDestination, destination)
	}
	if err := ctx.Err(); err != nil {
		return codec.Result{}, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		var cancel context.CancelFunc
		deadline = time.Now().Add(actors.DefaultTimeout)
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	req := &clusterpb.DeliverRequest{Destination: destination, Message: toWire(m)}
	backoff := minBackoff
	for {
		pid, err := n.resolve(ctx, destination)
		if err != nil {
			return codec.Result{}, err
		}
		if pid != nil {
			req.BudgetNanos = int64(time.Until(deadline))
			if req.BudgetNanos <= 0 {
				return codec.Result{}, n.unreachable(ctx)
			}
			answer, err := n.request(ctx, pid, req)
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
			case *actor.DeadLetterResponse:
				// Not delivered, so not admitted.
			case memberLeft:
				return codec.Result{}, fmt.Errorf("%w: its member left the cluster before answering", ErrUnreachable)
			}
			n.cache.forget(destination, pid)
		}
		if err := n.pause(ctx, backoff); err != nil {
			return codec.Result{}, err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// unreachable is the answer to a caller whose ctx ended before its owner
// answered.
func (n *Node) unreachable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, context.DeadlineExceeded)
}

// pause waits a jittered d, or until ctx ends or Leave gives up.
func (n *Node) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(rand.N(d) + 1)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return n.unreachable(ctx)
	case <-n.quit:
		return messages.ErrStopped
	}
}

// request sends msg to pid with the endpoint as its sender and waits for
// the answer: a reply, a dead letter, memberLeft. A nil answer with an error
// means the ctx ended or the node gave up first.
func (n *Node) request(ctx context.Context, pid *actor.PID, msg any) (any, error) {
	self := n.PID()
	id, c := n.calls.begin(pid.Address)
	sender := &actor.PID{Address: self.Address, Id: self.Id, RequestId: id}
	n.system.Root.RequestWithCustomSender(pid, msg, sender)
	select {
	case a := <-c.answer:
		return a, nil
	case <-ctx.Done():
		n.calls.end(id)
		return nil, n.unreachable(ctx)
	case <-n.quit:
		n.calls.end(id)
		return nil, fmt.Errorf("%w: the node left before its owner answered", ErrUnreachable)
	}
}

// resolve is the PID of destination's grain: cached, or activated on the
// owner the latest topology names. nil with a nil error: no owner could
// be reached this time.
func (n *Node) resolve(ctx context.Context, destination string) (*actor.PID, error) {
	if pid := n.cache.get(destination); pid != nil {
		return pid, nil
	}
	owner := n.topo.owner(destination)
	if owner == "" {
		return nil, nil
	}
	answer, err := n.request(ctx, actor.NewPID(owner, disthash.PartitionActivatorActorName),
		&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: destination, Kind: Kind}})
	if err != nil {
		return nil, err
	}
	if r, ok := answer.(*cluster.ActivationResponse); ok && r.Pid != nil && !r.Failed {
		n.cache.put(destination, r.Pid)
		return r.Pid, nil
	}
	return nil, nil
}
