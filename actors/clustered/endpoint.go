package clustered

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/messages"
)

// endpoint is a node's one registered process, at the same id on every
// member. It has no mailbox: each message is handled on its sender's
// goroutine. It takes
//   - on the caller's side, the answers to the node's requests (a
//     DeliverReply, an ActivationResponse, a dead letter), told apart by
//     the RequestId of the PID they were sent to;
//   - on the owner's side, the local instance's answers to admitted
//     deliveries (*messages.Delivered, whose Ref is the *admission), and
//     HandoffRequests from other members;
//   - *Deliver, the actor form of Node.Deliver.
type endpoint struct{ n *Node }

// admission is the Ref of a delivery a grain admitted: whom to answer.
type admission struct {
	destination string
	replyTo     *actor.PID // nil: the caller asked for no answer
}

func (e *endpoint) SendUserMessage(pid *actor.PID, message any) {
	_, msg, sender := actor.UnwrapEnvelope(message)
	n := e.n
	switch m := msg.(type) {
	case *clusterpb.DeliverReply, *cluster.ActivationResponse, *actor.DeadLetterResponse:
		n.calls.answer(pid.RequestId, m)
	case *messages.Delivered:
		a, ok := m.Ref.(*admission)
		if !ok {
			return
		}
		if a.replyTo != nil {
			n.system.Root.Send(a.replyTo, &clusterpb.DeliverReply{Id: m.ID, Sequence: m.Sequence, Error: encodeError(m.Err)})
		}
		n.apply(n.ledger.answered(a.destination))
	case *clusterpb.HandoffRequest:
		if sender != nil {
			n.apply(n.ledger.request(m.Destination, sender))
		}
	case *Deliver:
		n.deliverFor(sender, m)
	}
}

func (e *endpoint) SendSystemMessage(*actor.PID, any) {}

func (e *endpoint) Stop(*actor.PID) {}

// apply sends what a ledger change asks for.
func (n *Node) apply(h handoff) {
	if h.yield != nil {
		n.system.Root.Send(h.yield, yield{})
	}
	if len(h.done) == 0 {
		return
	}
	done := &clusterpb.HandoffDone{Destination: h.destination, Member: n.system.Address()}
	for _, w := range h.done {
		n.system.Root.Send(w, done)
	}
}
