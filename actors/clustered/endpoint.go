package clustered

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// endpoint is a node's one registered process, at the same id on every
// member. It has no mailbox: each message is handled on its sender's
// goroutine. It takes
//   - lease probes from other members' nodes, and the answers to this
//     node's (DeliverReplies carrying a LeaseProbe or a LeaseAnswer);
//   - on the caller's side, the answers to the node's deliveries
//     (DeliverReplies, each reply naming its call) and requests (an
//     ActivationResponse, a GroupsReply, a dead letter for a request or a
//     post), told apart by the RequestId of the PID they were sent to;
//     each ends only a call of the role it answers (see calls.go);
//   - on the owner's side, the local instance's refusals of admitted
//     deliveries (*messages.Delivered, whose Ref is the admitted record's
//     actors.Direct), HandoffRequests from other members, and their
//     GroupsRequests (Node.ResumeGroup and PausedGroups), answered with a
//     GroupsReply under the request's RequestId;
//   - a HandoffDone naming no destination: its member left gracefully;
//   - *Deliver, the actor form of Node.Deliver; anything else with a sender
//     is answered errNotDeliver.
type endpoint struct{ n *Node }

func (e *endpoint) SendUserMessage(pid *actor.PID, message any) {
	_, msg, sender := actor.UnwrapEnvelope(message)
	n := e.n
	if isNilMessage(msg) {
		n.notDeliver(sender, msg)
		return
	}
	switch m := msg.(type) {
	case *clusterpb.DeliverReplies:
		for _, r := range m.Replies {
			if r != nil {
				n.calls.reply(r)
			}
		}
		if m.LeaseProbe != nil {
			n.onLeaseProbe(sender, m.LeaseProbe)
		}
		if m.LeaseAnswer != nil {
			n.onLeaseAnswer(sender, m.LeaseAnswer)
		}
	case *cluster.ActivationResponse:
		n.calls.respond(pid.RequestId, requestAnswer{outcome: answered, activation: m})
	case *clusterpb.GroupsReply:
		n.calls.respond(pid.RequestId, requestAnswer{outcome: answered, groups: m})
	case *actor.DeadLetterResponse:
		n.onDeadLetter(pid.RequestId)
	case *messages.Delivered:
		if d, ok := m.Ref.(*actors.Direct); ok {
			if a, ok := d.Listener.(*admitted); ok {
				a.Answer(pid, codec.Result{ID: m.ID, Sequence: m.Sequence, Err: m.Err})
			}
		}
	case *clusterpb.HandoffDone:
		// Naming no destination, from another member: it left gracefully
		// (Node.sayLeft). Naming one: the member, leaving, hands over the
		// destination's paused groups (Node.handPausesOver). Grains take
		// the HandoffDones that answer their HandoffRequests.
		switch {
		case m.Member == "":
			n.notDeliver(sender, msg)
		case m.Destination == "":
			n.onLeft(m.Member)
		default:
			n.adoptPauses(m.Destination, m.Member, m.Paused)
		}
	case *clusterpb.HandoffRequest:
		if sender == nil {
			n.notDeliver(sender, msg)
			return
		}
		n.apply(n.ledger.request(m.Destination, sender))
	case *clusterpb.GroupsRequest:
		if sender == nil {
			n.notDeliver(sender, msg)
			return
		}
		n.onGroups(sender, m)
	case *Deliver:
		n.deliverFor(sender, m)
	default:
		n.notDeliver(sender, msg)
	}
}

// isNilMessage reports whether msg is a nil pointer of a type the endpoint
// takes. Only a sender in this process can make one (the wire never decodes
// one); it is answered as any other message the node does not take.
func isNilMessage(msg any) bool {
	switch m := msg.(type) {
	case *clusterpb.DeliverReplies:
		return m == nil
	case *cluster.ActivationResponse:
		return m == nil
	case *actor.DeadLetterResponse:
		return m == nil
	case *messages.Delivered:
		return m == nil
	case *clusterpb.HandoffDone:
		return m == nil
	case *clusterpb.HandoffRequest:
		return m == nil
	case *clusterpb.GroupsRequest:
		return m == nil
	case *clusterpb.GroupsReply:
		return m == nil
	case *Deliver:
		return m == nil
	}
	return false
}

// notDeliver answers msg, sent to the node's PID but not a non-nil
// *Deliver, at once: its sender would otherwise wait for its own timeout.
func (n *Node) notDeliver(sender *actor.PID, msg any) {
	n.log.Warn("sinkbatch: a clustered node takes only a non-nil *clustered.Deliver", slog.String("type", fmt.Sprintf("%T", msg)))
	if sender == nil {
		return
	}
	var ref any
	if v, isValue := msg.(Deliver); isValue {
		ref = v.Ref
	}
	n.system.Root.Send(sender, &messages.Delivered{Ref: ref, Err: errNotDeliver})
}

func (e *endpoint) SendSystemMessage(*actor.PID, any) {}

func (e *endpoint) Stop(*actor.PID) {}

// apply sends what a ledger change asks for.
func (n *Node) apply(h handoff) {
	if h.yield != nil {
		n.system.Root.Send(h.yield, yield{})
	}
	for _, g := range h.adopted {
		n.system.Root.Send(g, adopted{})
	}
	if len(h.done) == 0 {
		return
	}
	done := &clusterpb.HandoffDone{Destination: h.destination, Member: n.system.Address(), Paused: n.takePauses(h.destination)}
	for _, w := range h.done {
		n.system.Root.Send(w, done)
	}
}

// adoptPauses has the member's instance pause the groups of destination
// that member handed over (in a HandoffDone: answering a grain's
// HandoffRequest, or as it left), without waiting for it: the instance
// takes them in its batcher's mailbox's turn, which can be long. The
// adoption is counted in the ledger until the instance has them (or
// adoptWait passed, and they are on their way ahead of anything admitted
// later): meanwhile no grain of destination here admits (ledger.adopting)
// and the destination is not handed off, so its pauses are in place
// before the new owner admits and go with it when it moves on.
func (n *Node) adoptPauses(destination, member string, paused []*clusterpb.PausedGroup) {
	c := n.cfg.Destinations[destination]
	if c == nil || len(paused) == 0 {
		return
	}
	groups := pausesFromWire(paused)
	h := n.ledger.adoptBegin(destination)
	go func() {
		if testHookAdopt != nil {
			testHookAdopt()
		}
		ctx, cancel := context.WithTimeout(context.Background(), adoptWait)
		err := n.cfg.Instance.AdoptPausedGroups(ctx, c, groups)
		cancel()
		if err != nil {
			n.log.Warn("sinkbatch: the paused groups another member handed over could not be paused here",
				slog.String("destination", destination), slog.String("member", member), slog.Any("error", err))
		}
		n.apply(n.ledger.adoptEnd(h))
	}()
}

// testHookAdopt, if set (by tests only), runs as an adoption begins,
// before the instance is asked.
var testHookAdopt func()

// passPausesOn pauses the groups of destination that member handed over,
// in a HandoffDone that reached a grain no longer waiting for it, on the
// instance of destination's owner in this member's latest topology: here,
// or sent on to that owner's node. Pauses taken from an instance have no
// other copy.
func (n *Node) passPausesOn(destination, member string, paused []*clusterpb.PausedGroup) {
	if len(paused) == 0 {
		return
	}
	switch owner := n.topo.owner(destination); owner {
	case "", n.system.Address():
		n.adoptPauses(destination, member, paused)
	default:
		n.system.Root.Send(actor.NewPID(owner, endpointID), &clusterpb.HandoffDone{Destination: destination, Member: member, Paused: paused})
	}
}

// pausesFromWire is the paused groups of a HandoffDone.
func pausesFromWire(ps []*clusterpb.PausedGroup) []messages.PausedGroup {
	out := make([]messages.PausedGroup, 0, len(ps))
	for _, p := range ps {
		if p != nil {
			out = append(out, messages.PausedGroup{Group: p.Group, Key: p.Key, Then: p.Then, Left: time.Duration(p.LeftNanos)})
		}
	}
	return out
}

// takePauses removes destination's paused groups (Tuning.StrictGroups)
// from the member's instance, for its HandoffDone: the destination has
// moved, and its new owner pauses them in turn. Only a hand-off calls it,
// once the member admits nothing to destination and everything it
// admitted was answered, so no pause can come after it.
func (n *Node) takePauses(destination string) []*clusterpb.PausedGroup {
	c := n.cfg.Destinations[destination]
	if c == nil {
		return nil
	}
	taken, err := n.cfg.Instance.TakePausedGroups(context.Background(), c)
	if err != nil {
		n.log.Warn("sinkbatch: the paused groups of a destination handed off could not be read; its new owner does not pause them",
			slog.String("destination", destination), slog.Any("error", err))
		return nil
	}
	if len(taken) == 0 {
		return nil
	}
	out := make([]*clusterpb.PausedGroup, len(taken))
	for i, p := range taken {
		out[i] = &clusterpb.PausedGroup{Group: p.Group, Key: p.Key, Then: p.Then, LeftNanos: int64(p.Left)}
	}
	return out
}
