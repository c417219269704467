package actors

import (
	"context"

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
