package clustered

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
)

// This file is what a node waits for: its calls, one type per role, and the
// answers each may get.
//   - requestCall: a request to another member's process (an activation, a
//     GroupsRequest), answered with a requestAnswer;
//   - deliveryCall: one attempt of a delivery through its grain, queued in
//     an outbox and then written in a batch, answered with a
//     deliveryAnswer;
//   - postCall: a batch message on its way (deliveries to a grain, answers
//     to a caller process), which nobody waits on: it is kept for its dead
//     letter, which answers what it carried;
//   - directCall: a delivery admitted directly on the owner (Node.here),
//     answered with a directAnswer; it lives in directCalls, not calls.

// outcome is how a call ended.
type outcome uint8

const (
	// answered: its answer came; the answer carries it (a reply, a
	// response, a result).
	answered outcome = iota + 1
	// notSent: it never reached its target, so nothing was admitted: a
	// delivery that waited in an outbox whose member was cut off, or whose
	// batch message came back as a dead letter; a request that came back
	// as a dead letter; a call to a member that said it left gracefully
	// (see Node.onLeft).
	notSent
	// memberLeft: its target left the cluster (or this member was
	// dropped) before answering: a request or a delivery that may have
	// reached it.
	memberLeft
	// nodeQuit: Leave gave up waiting (calls.failAll): nothing will answer
	// it; a delivery may have been sent.
	nodeQuit
	// quitUnsent: Leave gave up before the delivery was written, or before
	// the call began: it never will be sent.
	quitUnsent
)

func (o outcome) String() string {
	switch o {
	case answered:
		return "answered"
	case notSent:
		return "not sent"
	case memberLeft:
		return "member left"
	case nodeQuit:
		return "node quit"
	case quitUnsent:
		return "node quit, not sent"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// requestAnswer ends a request. When answered, the response is in the
// field of its type: an activation's in activation, a GroupsRequest's in
// groups (a response of the other type leaves its own nil).
type requestAnswer struct {
	outcome    outcome
	activation *cluster.ActivationResponse
	groups     *clusterpb.GroupsReply
}

// deliveryAnswer ends a delivery through a grain: its owner's reply, when
// answered.
type deliveryAnswer struct {
	outcome outcome
	reply   *clusterpb.DeliverReply
}

// directAnswer ends a delivery admitted directly: the instance's result,
// when answered.
type directAnswer struct {
	outcome outcome
	result  codec.Result
}

// pendingCall is what calls holds under a number: a *requestCall, a
// *deliveryCall or a *postCall.
type pendingCall interface {
	// member is the address of the member it was sent to.
	member() string
}

// requestCall is a request waiting for its response, sent with its number
// as the RequestId of its sender PID (Node.request). Its caller's own.
type requestCall struct {
	target string
	answer chan requestAnswer // buffered: its one answer never blocks
	timer  *time.Timer        // keeps the caller's deadline, if its ctx does not
}

func (c *requestCall) member() string { return c.target }

// deliveryCall is one attempt of a delivery through a grain, waiting for
// its answer under its number (the DeliverRequest's Call). It is queued in
// an outbox until a batch takes it; batch is then that batch's post,
// registered under batchID. calls.mu guards queued, batch and batchID;
// the rest is its caller's.
type deliveryCall struct {
	target  string
	grain   *actor.PID          // told if its caller cancels once it was written
	answer  chan deliveryAnswer // buffered: its one answer never blocks
	timer   *time.Timer         // keeps the caller's deadline, if its ctx does not
	queued  bool
	batch   *postCall
	batchID uint32
}

func (c *deliveryCall) member() string { return c.target }

// deliveryCallPool recycles delivery calls, answer channel included: one
// is put back only once nobody can send on its channel any more.
var deliveryCallPool = sync.Pool{New: func() any { return &deliveryCall{answer: make(chan deliveryAnswer, 1)} }}

// recycle puts c back in deliveryCallPool; its answer was taken, or will
// never be sent.
func (c *deliveryCall) recycle() {
	c.target, c.grain, c.queued, c.batch, c.batchID = "", nil, false, nil, 0
	deliveryCallPool.Put(c)
}

// postCall is a batch message posted to a process (deliveries, an
// *outgoing, to a grain; answers, an *outgoingReplies, to a caller
// process), registered under the RequestId of its sender PID, under which
// a dead letter for it comes back. Nobody waits on it. A batch of
// deliveries that was taken keeps the numbers of those it carries (left of
// them still wait), for its dead letter to answer; it ends when one of them
// is answered with a reply (the batch reached its grain, so no dead letter
// will follow) or when none waits any more. Guarded by calls.mu.
type postCall struct {
	target     string
	deliveries *outgoing // exactly one of deliveries and replies is set
	replies    *outgoingReplies
	taken      bool
	carried    []uint32
	left       int
}

func (c *postCall) member() string { return c.target }

// directCall is a delivery admitted directly (Node.here) waiting for the
// instance's answer, in directCalls. pending is its token while it waits,
// 0 once answered or abandoned: whoever swaps it out answers it (see
// directCalls). token counts the deliveries c served, so that an answer
// meant for an earlier one is told apart. The caller owns token and timer;
// shard, prev and next are its shard's (directShard.mu).
type directCall struct {
	answer  chan directAnswer // buffered: its one answer never blocks
	pending atomic.Uint64
	token   uint64
	timer   *time.Timer // keeps the caller's deadline, if its ctx does not
	shard   uint8
	prev    *directCall
	next    *directCall
}

// directCallPool recycles direct calls, answer channel and token count
// included.
var directCallPool = sync.Pool{New: func() any { return &directCall{answer: make(chan directAnswer, 1)} }}

// newDirectCall is a direct call from directCallPool.
func newDirectCall() *directCall { return directCallPool.Get().(*directCall) }

// recycle puts c back in directCallPool; it is out of its shard, and its
// answer was taken or will never be sent.
func (c *directCall) recycle() { directCallPool.Put(c) }

// calls are a node's requests, deliveries through grains and posts waiting
// for what ends them, each under a number: the RequestId of the sender PID
// a request or a post hands out (the endpoint's PID), or the Call of a
// DeliverRequest. Number 0 is never handed out. Safe for concurrent use.
type calls struct {
	mu  sync.Mutex
	seq uint32                 // the last number handed out
	m   map[uint32]pendingCall // guarded by mu
	// quit: failAll ran. A call then begins unregistered (number 0) and
	// its caller answers it quitUnsent at once, so that waiting for an
	// answer needs no channel shared by every caller (a select locks each
	// of its channels: one shared by all callers is a lock they all
	// contend for). Guarded by mu.
	quit bool
}

// add registers c and returns its number; 0 after failAll: c is not
// registered, and nothing is to be sent. cs.mu must be held.
func (cs *calls) add(c pendingCall) uint32 {
	if cs.quit {
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

// beginRequest registers a request to target and returns its number (0:
// Leave gave up; send nothing).
func (cs *calls) beginRequest(target string) (uint32, *requestCall) {
	c := &requestCall{target: target, answer: make(chan requestAnswer, 1)}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(c), c
}

// beginDelivery registers a delivery to target, about to be queued in an
// outbox, and returns its number (0: Leave gave up; queue nothing, and
// recycle c).
func (cs *calls) beginDelivery(target string) (uint32, *deliveryCall) {
	c := deliveryCallPool.Get().(*deliveryCall)
	c.target, c.queued = target, true
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(c), c
}

// beginPost registers p, a post about to be sent, and returns its number:
// the RequestId of its sender PID, under which a dead letter for it comes
// back.
func (cs *calls) beginPost(p *postCall) uint32 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.add(p)
}

// reply ends delivery r.Call with r, if it still waits, and the batch it
// went in (it reached its grain, so no dead letter will follow). A reply
// naming no waiting delivery (answered or given up already, or a number
// of another kind) is dropped.
func (cs *calls) reply(r *clusterpb.DeliverReply) {
	cs.mu.Lock()
	c, ok := cs.m[r.Call].(*deliveryCall)
	if !ok {
		cs.mu.Unlock()
		return
	}
	delete(cs.m, r.Call)
	cs.endBatch(c)
	cs.mu.Unlock()
	c.answer <- deliveryAnswer{outcome: answered, reply: r}
}

// respond ends request id with a, if it still waits. A response naming no
// waiting request is dropped.
func (cs *calls) respond(id uint32, a requestAnswer) {
	cs.mu.Lock()
	c, ok := cs.m[id].(*requestCall)
	if ok {
		delete(cs.m, id)
	}
	cs.mu.Unlock()
	if ok {
		c.answer <- a
	}
}

// deadLetter ends call id, whose message came back undelivered: a request
// or a delivery is answered notSent; a post that was taken answers notSent
// the deliveries it carried that still wait; a post not taken yet is
// returned, for its box to be given up.
func (cs *calls) deadLetter(id uint32) (untaken *postCall) {
	cs.mu.Lock()
	c := cs.m[id]
	if c == nil {
		cs.mu.Unlock()
		return nil
	}
	delete(cs.m, id)
	switch c := c.(type) {
	case *postCall:
		var waiting []*deliveryCall
		for _, d := range c.carried {
			if dc, ok := cs.m[d].(*deliveryCall); ok && dc.batch == c {
				delete(cs.m, d)
				waiting = append(waiting, dc)
			}
		}
		cs.mu.Unlock()
		for _, w := range waiting {
			w.answer <- deliveryAnswer{outcome: notSent}
		}
		if c.taken {
			return nil
		}
		return c
	case *deliveryCall:
		cs.release(c)
		cs.mu.Unlock()
		c.answer <- deliveryAnswer{outcome: notSent}
	case *requestCall:
		cs.mu.Unlock()
		c.answer <- requestAnswer{outcome: notSent}
	}
	return nil
}

// endBatch ends the batch delivery c went in, if any. cs.mu must be held.
func (cs *calls) endBatch(c *deliveryCall) {
	if c.batch != nil && cs.m[c.batchID] == pendingCall(c.batch) {
		delete(cs.m, c.batchID)
	}
}

// release counts out delivery c from its batch, which ends once none of
// its deliveries waits. cs.mu must be held.
func (cs *calls) release(c *deliveryCall) {
	if c.batch == nil {
		return
	}
	c.batch.left--
	if c.batch.left <= 0 {
		cs.endBatch(c)
	}
}

// end forgets call id, whose caller stopped waiting (or a post, replaced
// or written). It reports whether the call still waited (if not, its
// answer is on its way) and whether it had been written (a delivery no
// longer queued; any other call).
func (cs *calls) end(id uint32) (waited, written bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[id]
	if c == nil {
		return false, false
	}
	delete(cs.m, id)
	if d, ok := c.(*deliveryCall); ok {
		cs.release(d)
		return true, !d.queued
	}
	return true, true
}

// carry records that post id takes queued, dropping (in place) the
// deliveries whose caller stopped waiting or whose deadline passed by now:
// they are not sent. It returns those it carries.
func (cs *calls) carry(id uint32, queued []queuedDelivery, now time.Time) []queuedDelivery {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	b, _ := cs.m[id].(*postCall)
	if b != nil {
		b.taken = true
	}
	kept := queued[:0]
	for _, q := range queued {
		c, ok := cs.m[q.call].(*deliveryCall)
		if !ok || !c.queued || !q.deadline.After(now) {
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

// failQueued answers with o the deliveries of queued still waiting in an
// outbox.
func (cs *calls) failQueued(queued []queuedDelivery, o outcome) {
	var waiting []*deliveryCall
	cs.mu.Lock()
	for _, q := range queued {
		if c, ok := cs.m[q.call].(*deliveryCall); ok && c.queued {
			delete(cs.m, q.call)
			waiting = append(waiting, c)
		}
	}
	cs.mu.Unlock()
	for _, c := range waiting {
		c.answer <- deliveryAnswer{outcome: o}
	}
}

// failMember answers every call to address: notSent for a delivery still
// queued, memberLeft for the rest (notSent too if graceful: the member
// said it admits nothing more); posts to it are forgotten.
func (cs *calls) failMember(address string, graceful bool) {
	cs.fail(func(c pendingCall) bool { return c.member() == address }, graceful)
}

// failAll answers every call nodeQuit (quitUnsent: a delivery still
// queued), now and from now on.
func (cs *calls) failAll() {
	cs.mu.Lock()
	cs.quit = true
	cs.mu.Unlock()
	cs.fail(func(pendingCall) bool { return true }, false)
}

func (cs *calls) fail(match func(pendingCall) bool, graceful bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for id, c := range cs.m {
		if !match(c) {
			continue
		}
		delete(cs.m, id)
		switch c := c.(type) {
		case *requestCall:
			c.answer <- requestAnswer{outcome: cs.failure(false, graceful)}
		case *deliveryCall:
			c.answer <- deliveryAnswer{outcome: cs.failure(c.queued, graceful)}
		}
	}
}

// failure is the outcome of a call that fail ends. cs.mu must be held.
func (cs *calls) failure(queued, graceful bool) outcome {
	switch {
	case cs.quit && queued:
		return quitUnsent
	case cs.quit:
		return nodeQuit
	case queued, graceful:
		return notSent
	}
	return memberLeft
}
