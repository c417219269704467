package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// Sender is what a relay delivers through.
type Sender interface {
	Send(ctx context.Context, destination string, m codec.Message) (codec.Result, error)
}

// OrderedSender is a Sender that can start a delivery without waiting for
// its result, so that a relay keeps many rows of one group in flight and
// still has them sent in row order.
//
// Begin hands m to the destination and returns without waiting: messages
// of one group whose Begin calls return one after the other, from one
// goroutine, are admitted in that order. done is called exactly once with
// m's result, from any goroutine, possibly before Begin returns; it must
// not block. The message is never sent after deadline unless its request
// had already left. A relay whose Sender is not an OrderedSender keeps at
// most one row of each group in flight.
//
// Local and Cluster return OrderedSenders.
type OrderedSender interface {
	Sender
	Begin(destination string, m codec.Message, deadline time.Time, done func(codec.Result, error))
}

// UnknownDestinationError answers a row whose Destination the Sender does
// not know. Permanent: the row is marked dead.
type UnknownDestinationError struct{ Destination string }

func (e *UnknownDestinationError) Error() string {
	return fmt.Sprintf("sinkbatch/outbox: unknown destination %q", e.Destination)
}

// PermanentFailure marks the error permanent for codec.IsPermanent.
func (e *UnknownDestinationError) PermanentFailure() bool { return true }

// Local delivers through one process's instance, to the codecs named by
// destinations (the map is copied). For the order of groups, give each
// codec Tuning.StrictGroups. It spawns one small actor in inst's actor
// system that receives the answers; it lives as long as the system.
func Local(inst *actors.Instance, destinations map[string]codec.Codec) Sender {
	dests := make(map[string]codec.Codec, len(destinations))
	for k, v := range destinations {
		dests[k] = v
	}
	s := &localSender{system: inst.System(), target: inst.PID, dests: dests}
	s.start()
	return s
}

// localCall is one delivery Local begins, in one allocation: its Deliver,
// the Direct that names it as its own Listener (the batcher answers it
// straight from the request goroutine, with no message and no process
// registry lookup), and room for the batcher's entry. Answers that come
// as a message instead (the supervisor's refusal while it stops) reach it
// through the sender's answers actor. A relay's row listens until its
// deadline, which the batcher keeps itself.
type localCall struct {
	done     func(codec.Result, error)
	answered atomic.Bool
	direct   actors.Direct
	deliver  messages.Deliver
	room     actors.Room
}

// Listening implements actors.Listener: a row's delivery is never given up
// on before its deadline.
func (c *localCall) Listening(*actor.PID) bool { return true }

// Answer implements actors.Listener: done is called once.
func (c *localCall) Answer(_ *actor.PID, r codec.Result) {
	if c.answered.CompareAndSwap(false, true) {
		c.done(codec.Result{ID: r.ID, Sequence: r.Sequence}, r.Err)
	}
}

// Forgotten implements actors.Forgetter. Listening never says no, so a
// batcher does not drop the entry unanswered; were it to, the row is
// answered as not sent, and tried again.
func (c *localCall) Forgotten(*actor.PID) {
	c.Answer(nil, codec.Result{Err: errForgotten})
}

var errForgotten = errors.New("sinkbatch/outbox: the batcher dropped the delivery unsent")

// Cluster delivers through a cluster member: every replica's rows for one
// destination go to the one batcher the cluster runs for it. Destination
// names are the node's (clustered.Config.Destinations). It delivers with
// Node.DeliverResult, which waits for each answer, so a relay keeps one row
// of each group in flight (see OrderedSender); rows of different groups go
// at once.
func Cluster(node *clustered.Node) Sender {
	return clusterSender{node}
}

type clusterSender struct{ node *clustered.Node }

func (s clusterSender) Send(ctx context.Context, destination string, m codec.Message) (codec.Result, error) {
	return s.node.DeliverResult(ctx, destination, m)
}

// localSender sends each delivery to target from the caller's goroutine,
// so that deliveries begun one after the other reach the batcher in that
// order, each naming its own localCall as the Listener the batcher
// answers. Its answers actor takes the answers that come as messages.
type localSender struct {
	system  *actor.ActorSystem
	target  func() *actor.PID
	dests   map[string]codec.Codec
	answers *actor.PID
}

func (s *localSender) start() {
	s.answers = s.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*messages.Delivered); ok {
			if r, ok := d.Ref.(*actors.Direct); ok {
				if call, ok := r.Listener.(*localCall); ok {
					call.Answer(nil, codec.Result{ID: d.ID, Sequence: d.Sequence, Err: d.Err})
				}
			}
		}
	}))
}

// Begin implements OrderedSender.
func (s *localSender) Begin(destination string, m codec.Message, deadline time.Time, done func(codec.Result, error)) {
	c, ok := s.dests[destination]
	if !ok || c == nil {
		done(codec.Result{}, &UnknownDestinationError{Destination: destination})
		return
	}
	call := &localCall{done: done}
	call.direct = actors.Direct{Listener: call, Sender: s.answers, Room: &call.room}
	call.deliver = messages.Deliver{Codec: c, Message: m, Deadline: deadline, Ref: &call.direct}
	// No envelope: the batcher answers the Direct's Listener.
	s.system.Root.Send(s.target(), &call.deliver)
}

// Send implements Sender: Begin, then wait for the answer or ctx.
func (s *localSender) Send(ctx context.Context, destination string, m codec.Message) (codec.Result, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(actors.DefaultTimeout)
	}
	type answer struct {
		r   codec.Result
		err error
	}
	ch := make(chan answer, 1)
	s.Begin(destination, m, deadline, func(r codec.Result, err error) { ch <- answer{r, err} })
	select {
	case a := <-ch:
		return a.r, a.err
	case <-ctx.Done():
		return codec.Result{}, ctx.Err()
	}
}

// serialSender makes an OrderedSender of a plain Sender: a group's rows
// are sent one at a time, in the order begun; rows without a group each at
// once.
type serialSender struct {
	Sender
	mu     sync.Mutex
	groups map[string][]serialCall // guarded by mu; a key is deleted when its queue empties
}

type serialCall struct {
	destination string
	m           codec.Message
	deadline    time.Time
	done        func(codec.Result, error)
}

func (s *serialSender) Begin(destination string, m codec.Message, deadline time.Time, done func(codec.Result, error)) {
	c := serialCall{destination, m, deadline, done}
	if m.Group == "" {
		go s.send(c)
		return
	}
	key := destination + "\x00" + m.Group
	s.mu.Lock()
	q, running := s.groups[key]
	s.groups[key] = append(q, c)
	s.mu.Unlock()
	if !running {
		go s.drain(key)
	}
}

func (s *serialSender) send(c serialCall) {
	ctx, cancel := context.WithDeadline(context.Background(), c.deadline)
	r, err := s.Send(ctx, c.destination, c.m)
	cancel()
	c.done(r, err)
}

// drain sends key's queue head by head until it is empty.
func (s *serialSender) drain(key string) {
	for {
		s.mu.Lock()
		q := s.groups[key]
		if len(q) == 0 {
			delete(s.groups, key)
			s.mu.Unlock()
			return
		}
		c := q[0]
		s.mu.Unlock()
		s.send(c)
		s.mu.Lock()
		s.groups[key] = s.groups[key][1:]
		s.mu.Unlock()
	}
}
