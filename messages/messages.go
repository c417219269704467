package messages

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/codec"
)

// Deliver asks for one message to be sent to the destination its Codec
// describes. Its Message (Body, Attributes) is read until the message's
// request has ended, which can be after the caller stopped waiting: do not
// change it after sending the Deliver. Send it with a sender (ctx.Request,
// RequestFuture) to the instance's PID; the answer is one *Delivered, sent
// once the message's result is known. A Deliver sent without a sender is sent
// all the same, and nobody is answered. protoactor's Future writes its result
// outside its lock, so a RequestFuture whose timeout can end before the
// answer comes is a data race inside protoactor, which the race detector
// reports; an actor sender, or Instance.Deliver, has none.
type Deliver struct {
	Codec   codec.Codec
	Message codec.Message
	// Deadline is when the caller stops waiting. An entry still queued then
	// is never sent, and its caller is answered with an error wrapping
	// context.DeadlineExceeded. Zero: the instance's DefaultTimeout from
	// the moment the batcher receives it.
	Deadline time.Time
	// Ref is the caller's own correlation value, echoed in Delivered.Ref.
	Ref any
	// SpanContext is the caller's span when the instance traces
	// (actors.Config.TracerProvider): the delivery's create span is its
	// child, and the message carries the create span's context to its
	// consumer. Instance.Deliver sets it from its ctx. Zero: a new trace.
	SpanContext trace.SpanContext
}

// Delivered is the answer to a Deliver.
type Delivered struct {
	Ref any
	// ID is the message id the destination assigned when Err is nil.
	ID string
	// Sequence is the destination's sequence number where it assigns one
	// (SQS FIFO queues).
	Sequence string
	// Err says why the message was not accepted: one of the errors in the
	// package doc's catalogue. Branch on it with errors.Is / errors.As and
	// codec.IsPermanent.
	Err error
}

var (
	// ErrStopped answers deliveries that reach an instance that is stopping
	// or stopped, and, when Stop's context expires, every delivery the
	// instance still holds: queued ones were never sent, but one whose
	// request was in flight may have been stored. Retry with the same
	// idempotency key.
	ErrStopped = errors.New("sinkbatch: instance stopped")
	// ErrBatcherDown answers every delivery a batcher held, queued or in a
	// request, when it crashed and was restarted: the message may or may not
	// have reached the destination. Retrying with the same idempotency key is
	// safe.
	ErrBatcherDown = errors.New("sinkbatch: batcher restarted before the answer was known")
	// ErrNilCodec answers a Deliver whose Codec is nil (a nil interface, or
	// a typed nil pointer). Permanent (codec.IsPermanent).
	ErrNilCodec = codec.Permanent(errors.New("sinkbatch: nil codec"))
	// ErrNotDeliver answers a message sent to an instance's PID that is not
	// a non-nil *Deliver (a Deliver sent by value, a nil pointer, another
	// type). Permanent.
	ErrNotDeliver = codec.Permanent(errors.New("sinkbatch: an instance takes only a non-nil *messages.Deliver"))
)

// GroupPausedError answers a delivery of a group that is paused
// (Tuning.StrictGroups): an earlier message of the group was answered
// without a final result (a retryable failure, an expiry, a restart) and the
// group waits for its retry. The message was never sent. Retryable: deliver
// it again, with the same IdempotencyKey, after the message keyed Key has
// been retried (the group admits the retries it waits for in the order it
// first delivered them), or after After.
type GroupPausedError struct {
	Group string        // the paused group
	Key   string        // IdempotencyKey of the retry the group waits for next
	After time.Duration // a suggested wait before delivering again, drawn from (0, Tuning.RetryAfterMax]; 0 when unknown
}

func (e *GroupPausedError) Error() string {
	return fmt.Sprintf("sinkbatch: group %q is paused until the message with idempotency key %q is retried", e.Group, e.Key)
}

// ErrNoIdempotencyKey answers a grouped delivery without an IdempotencyKey
// to a destination with Tuning.StrictGroups: a paused group knows its failed
// message's retry by that key, so without one the group could only wait for
// GroupPauseMax. Permanent: set codec.Message.IdempotencyKey.
var ErrNoIdempotencyKey = codec.Permanent(errors.New("sinkbatch: StrictGroups needs an IdempotencyKey on every message with a Group (codec.Message.IdempotencyKey)"))

// PausedGroup is a paused group (Tuning.StrictGroups) as one instance hands
// it to another: see actors.Instance.TakePausedGroups and
// AdoptPausedGroups.
type PausedGroup struct {
	Group string
	Key   string        // IdempotencyKey of the retry the group waits for next
	Then  []string      // the keys of the retries it waits for after Key, in order
	Left  time.Duration // until the pause runs out (GroupPauseMax)
}

// FullReason says which bound refused a delivery.
type FullReason int

// The bounds a destination's queue enforces.
const (
	FullEntries FullReason = iota // Tuning.QueueMax entries queued (with WhenFull Block: or waiting)
	FullBytes                     // Tuning.QueueMaxBytes bytes queued
	FullTenant                    // Tuning.TenantMax entries of the delivery's tenant queued
)

func (r FullReason) String() string {
	switch r {
	case FullEntries:
		return "entries"
	case FullBytes:
		return "bytes"
	case FullTenant:
		return "tenant"
	}
	return fmt.Sprintf("FullReason(%d)", int(r))
}

// RetryAfterError answers a delivery that did not fit in its destination's
// queue. Nothing was queued; send it again after After, which is drawn
// uniformly from (0, Tuning.RetryAfterMax] so that refused callers do not
// return together.
type RetryAfterError struct {
	After  time.Duration
	Reason FullReason
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("sinkbatch: queue full (%s), retry after %v", e.Reason, e.After)
}

// LogValue keeps the codec, which may hold credentials, and the payload out
// of logs (protoactor logs undeliverable messages whole).
func (d *Deliver) LogValue() slog.Value {
	sink := "<nil>"
	if d.Codec != nil {
		sink = d.Codec.Name()
	}
	return slog.GroupValue(
		slog.String("sink", sink),
		slog.String("tenant", d.Message.Tenant),
		slog.String("group", d.Message.Group),
		slog.Int("bytes", len(d.Message.Body)),
	)
}

// String is LogValue for fmt.
func (d *Deliver) String() string { return "Deliver" + d.LogValue().String() }
