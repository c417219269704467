package actors

import (
	"context"
	"fmt"
	"slices"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// ResumeGroup resumes group of the destination c describes, if it is paused
// after a retryable failure (Tuning.StrictGroups): its next delivery is
// admitted again, whether or not the failed message was retried. Resuming a
// group that is not paused, or a destination with no batcher, does nothing.
// Pauses are logged at INFO, and so are resumes.
//
// It returns ErrNilContext for a nil ctx, ctx.Err() if ctx has ended, and
// the codec's error if c is not a valid codec (messages.ErrNilCodec, a
// Tuning refused by Check). It does not wait: it reaches the destination's
// rules under their lock rather than through its mailbox.
func (i *Instance) ResumeGroup(ctx context.Context, c codec.Codec, group string) error {
	if err := checkCall(ctx, c); err != nil {
		return err
	}
	_, err := i.sup.ResumeGroup(c, group)
	return err
}

// PausedGroups lists the paused groups of the destination c describes,
// sorted: the groups whose deliveries are answered
// *messages.GroupPausedError. A destination with no batcher has none. Its
// errors are ResumeGroup's.
func (i *Instance) PausedGroups(ctx context.Context, c codec.Codec) ([]string, error) {
	if err := checkCall(ctx, c); err != nil {
		return nil, err
	}
	return i.sup.PausedGroups(c)
}

// TakePausedGroups removes the paused groups of the destination c
// describes from this instance and returns them, each with the time its
// pause has left (GroupPauseMax), sorted by group: for another instance,
// which takes over the destination, to adopt (AdoptPausedGroups). Cluster
// mode hands pauses over this way when a destination moves between
// members. Deliveries of those groups are admitted here again. Its errors
// are ResumeGroup's.
func (i *Instance) TakePausedGroups(ctx context.Context, c codec.Codec) ([]messages.PausedGroup, error) {
	if err := checkCall(ctx, c); err != nil {
		return nil, err
	}
	return i.sup.TakePauses(c)
}

// AdoptPausedGroups pauses groups of the destination c describes, each for
// the time it has left (at most the destination's GroupPauseMax), as if
// their messages had failed here: a group's next delivery is answered
// *messages.GroupPausedError until the message keyed Key is retried,
// ResumeGroup, or the time runs out. It returns once the destination's
// batcher (started if need be) has the pauses: PausedGroups lists them
// then. If ctx ends while it waits for the batcher (the error wraps
// ctx.Err()), the pauses are on their way all the same: they are in place
// before any delivery made after the call returned is admitted. A ctx that
// had ended before the call adopts nothing. A group that is paused already
// keeps its pause,
// and a destination without StrictGroups pauses nothing. It returns
// messages.ErrStopped once Stop was called, a permanent error adopting
// nothing if a group has no name or waits for an empty key (no grouped
// delivery can carry one), and otherwise ResumeGroup's errors.
func (i *Instance) AdoptPausedGroups(ctx context.Context, c codec.Codec, groups []messages.PausedGroup) error {
	if err := checkCall(ctx, c); err != nil {
		return err
	}
	for _, g := range groups {
		if g.Group == "" || g.Key == "" || slices.Contains(g.Then, "") {
			return codec.Permanent(fmt.Errorf("sinkbatch: AdoptPausedGroups: group %.64q has no name or waits for an empty idempotency key", g.Group))
		}
	}
	return i.sup.AdoptPauses(ctx, c, groups)
}

// checkCall checks the arguments every call about a destination takes.
func checkCall(ctx context.Context, c codec.Codec) error {
	if ctx == nil {
		return ErrNilContext
	}
	if c == nil {
		return messages.ErrNilCodec
	}
	return ctx.Err()
}
