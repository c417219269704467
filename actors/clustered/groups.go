package clustered

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/messages"
)

// ResumeGroup resumes group of destination if it is paused after a
// retryable failure (Tuning.StrictGroups), wherever the caller is: the
// node asks the instance of the member that owns destination in its latest
// topology, where the pause is, and returns when that instance resumed it
// (see actors.Instance.ResumeGroup). Resuming is idempotent, so an attempt
// that gets no answer (the owner left, or is unreachable) is made again,
// to the owner resolved anew, until ctx ends; then the error wraps
// ErrUnreachable and ctx.Err(). With no deadline in ctx it waits at most
// actors.DefaultTimeout.
//
// While destination is being handed off (a member joined or left, and the
// new owner waits for the old one to drain), its pauses are on their way
// from the old owner to the new one: a resume made then can reach the new
// owner before them and find nothing to resume, and PausedGroups can list
// none. Such a group stays paused until its failed message's retry or
// GroupPauseMax; resume it again once the hand-off is over.
//
// The request is sent only to an owner whose node answers lease probes
// (see the package doc, Fencing), which every version that takes group
// requests does: an owner of an earlier version is not sent it (a message
// of a type it does not know would end its stream from this member), and
// the call ends, at ctx's end, with an error that says so.
func (n *Node) ResumeGroup(ctx context.Context, destination, group string) error {
	_, err := n.groups(ctx, destination, group, true)
	return err
}

// PausedGroups lists destination's paused groups, sorted, as the instance
// of the member that owns it has them (see actors.Instance.PausedGroups).
// It waits and fails as ResumeGroup does.
func (n *Node) PausedGroups(ctx context.Context, destination string) ([]string, error) {
	return n.groups(ctx, destination, "", false)
}

// groups resumes group of destination (resume), or lists its paused
// groups, on its owner's instance.
func (n *Node) groups(ctx context.Context, destination, group string, resume bool) ([]string, error) {
	if ctx == nil {
		return nil, actors.ErrNilContext
	}
	if !n.inflight.enter() {
		return nil, messages.ErrStopped
	}
	defer n.inflight.exit()
	if _, ok := n.cfg.Destinations[destination]; !ok {
		return nil, fmt.Errorf("%w %s", ErrUnknownDestination, clipName(destination))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(actors.DefaultTimeout)
	}
	req := &clusterpb.GroupsRequest{Destination: destination, Group: group, Resume: resume}
	backoff := minBackoff
	for {
		older := ""
		switch owner := n.topo.owner(destination); owner {
		case "":
		case n.system.Address():
			return n.localGroups(ctx, req)
		default:
			if !n.lease.speaks(owner) {
				// It has not answered a lease probe: it may be of a
				// version without GroupsRequest, which would end its
				// stream from this member. Ask again: the owner may
				// change, or answer a probe.
				older = owner
				break
			}
			a, err := n.request(ctx, deadline, actor.NewPID(owner, endpointID), req)
			if err != nil {
				return nil, err
			}
			switch a.outcome {
			case answered:
				if r := a.groups; r != nil {
					if r.Error != nil {
						return nil, decodeError(r.Error)
					}
					return r.Paused, nil
				}
			case nodeQuit, quitUnsent:
				return nil, messages.ErrStopped
			}
			// A dead letter, a member that left or could not be
			// reached: ask again, the owner resolved anew.
		}
		if err := n.pause(ctx, deadline, backoff); err != nil {
			if older != "" {
				return nil, fmt.Errorf("%w (the owner, %s, has not said it takes group requests: it may run an earlier version of sinkbatch)", err, older)
			}
			return nil, err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// localGroups does what req asks on this member's instance.
func (n *Node) localGroups(ctx context.Context, req *clusterpb.GroupsRequest) ([]string, error) {
	c, ok := n.cfg.Destinations[req.Destination]
	if !ok {
		return nil, fmt.Errorf("%w %s", ErrUnknownDestination, clipName(req.Destination))
	}
	if req.Resume {
		return nil, n.cfg.Instance.ResumeGroup(ctx, c, req.Group)
	}
	return n.cfg.Instance.PausedGroups(ctx, c)
}

// onGroups answers req, from another member's node: on this member's
// instance whether or not this member owns the destination (its topology
// may be older or newer than the sender's; the sender's names this member).
func (n *Node) onGroups(sender *actor.PID, req *clusterpb.GroupsRequest) {
	paused, err := n.localGroups(context.Background(), req)
	n.system.Root.Send(sender, &clusterpb.GroupsReply{Paused: paused, Error: encodeError(err)})
}
