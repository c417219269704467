package codec

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Message is one delivery's payload as the caller hands it to sinkbatch. The
// batcher reads Tenant and Group; the codec maps the rest onto the
// destination's request.
type Message struct {
	// Tenant is the fairness unit: entries are taken round-robin across
	// tenants. "" is a tenant like any other.
	Tenant string
	// Group is the ordering group (an SQS MessageGroupId, a Pub/Sub ordering
	// key). Entries of one group are sent in admission order, with at most one
	// request of the group in flight. "" means unordered.
	Group string
	// IdempotencyKey travels with the message; the codec decides where
	// (an SQS deduplication id, an attribute).
	IdempotencyKey string
	Body           []byte
	Attributes     map[string]string
	// Trace is the W3C trace context the message carries to its consumer.
	// The batcher sets it to the message's create span when the instance
	// traces; a codec writes it into the message as its destination's
	// consumers read it (and may be told not to), and counts it in Size and
	// in its attribute limits.
	Trace TraceContext
}

// TraceContext is a W3C trace context (https://www.w3.org/TR/trace-context/)
// in its header form. The zero value carries nothing.
type TraceContext struct {
	Parent string // the traceparent header, e.g. "00-<trace id>-<span id>-01"
	State  string // the tracestate header; often ""
}

// Result is the destination's answer for one message of a batch.
type Result struct {
	// ID is the message id the destination assigned.
	ID string
	// Sequence is the destination's sequence number where it assigns one
	// (SQS FIFO queues); "" elsewhere.
	Sequence string
	// Err is nil when the destination accepted the message.
	Err error
}

// Limits are the destination API's hard limits for one request. Tuning may
// only tighten them.
type Limits struct {
	MaxEntries int // messages in one request
	MaxBytes   int // the sum of the messages' Size in one request
	// OneGroupPerRequest says every message of one request must carry the
	// same Group, "" included (Pub/Sub: one ordering key per Publish). The
	// batcher then builds each batch from one group, or from ungrouped
	// entries only.
	OneGroupPerRequest bool
}

// Tuning is a destination's batch tuning, set per codec. A zero field takes
// its default; a negative one, or one above the codec's Limits, is refused
// (Check names the field; the sqs and pubsub codecs call it in New, and a
// custom codec's bad Tuning is refused, permanently, at its first delivery).
// Tuning is part of the destination's identity: codecs that differ in it
// never share a batcher.
//
// A batch goes out when the sendable entries reach MaxEntries or MaxBytes,
// or Linger after the queue became non-empty (or after the last batch left;
// longer on a loaded instance, see Linger), whichever is first, with at most
// MaxInflight requests in flight.
//
// Choosing a policy: keep the zero Tuning when callers already retry on
// messages.RetryAfterError and losing order after a failure is acceptable (a
// retry is a later send). Set WhenFull to Block when callers are simple
// loops that should not retry bursts themselves. Set StrictGroups on FIFO
// queues and ordering keys when a group's order must survive failures. Set
// Adaptive when the destination's capacity is unknown or changes, or when it
// throttles; keep a fixed MaxInflight when you know the right value.
type Tuning struct {
	// MaxEntries is the most messages one request carries. Default and
	// ceiling: Limits.MaxEntries (SQS 10, Pub/Sub 1000).
	MaxEntries int
	// MaxBytes is the most bytes (the sum of Size) one request carries.
	// Default and ceiling: Limits.MaxBytes (SQS 1,048,576 counting bodies
	// and attribute names, types and values; Pub/Sub 10,000,000 less the
	// topic field, as encoded).
	MaxBytes int
	// Linger is how long a batch that is not full waits for more entries.
	// Default DefaultLinger (5ms). It is the wait at light load: while the
	// instance has more requests in flight than this destination's
	// MaxInflight (so other destinations are sending too) and this
	// destination's requests take longer than Linger on average, the
	// requests queue for something the destinations share (the CPU, a
	// server, a connection), and a batch waits as long as the destination's
	// mean request time instead (at most 64 × Linger, and leaving a request
	// time before its earliest caller's deadline), so that it carries more
	// messages for each request. While the instance has no more requests in
	// flight than that, a batch leaves Linger after its first message,
	// whatever the request time: a lone caller waits Linger plus the request
	// time.
	Linger time.Duration
	// MaxInflight is the most requests in flight for this destination (the
	// ceiling of the adaptive limit with Adaptive). Default: the instance's
	// SinkConcurrency (8).
	MaxInflight int
	// QueueMax is the most entries the destination queues; with WhenFull
	// Block, also the most deliveries that wait for room. Default
	// DefaultQueueMax (4096).
	QueueMax int
	// QueueMaxBytes is the most bytes (the sum of Size) the destination
	// queues. Default: DefaultQueueMaxBytes (128 MiB), or MaxBytes if that
	// is larger, so that the default never refuses a message that fits one
	// request. Check refuses a value below MaxBytes: a full request could
	// never be queued.
	QueueMaxBytes int64
	// TenantMax is the most entries one tenant may have queued. Default
	// DefaultTenantMax (1024).
	TenantMax int
	// RetryAfterMax is the ceiling of the full-jitter After of a
	// messages.RetryAfterError, so that refused callers do not return
	// together. Default DefaultRetryAfterMax (1s).
	RetryAfterMax time.Duration
	// IdleTimeout is how long a batcher with nothing queued, waiting or in
	// flight and no group paused lives on before it stops. Default
	// DefaultIdleTimeout (1 minute).
	IdleTimeout time.Duration
	// WhenFull says what happens to a delivery that does not fit the queue:
	// Refuse (the default) answers it messages.RetryAfterError at once;
	// Block lets it wait for room until its deadline, and while anything
	// waits a new delivery waits for its turn too. Waiters are admitted
	// round-robin across tenants, in arrival order within a tenant, and a
	// group's waiters never overtake each other; the waiter whose turn it
	// is keeps it until room for it frees (only a waiter held by its own
	// tenant's TenantMax passes its turn on). At most QueueMax deliveries
	// wait; past that a tenant with fewer waiters takes the place of the
	// newest waiter of the tenant with the most, or the delivery is refused
	// as with Refuse.
	WhenFull FullPolicy
	// StrictGroups: every answer that leaves a message's fate to its
	// caller (a retryable failure, an expiry in the queue or in flight, a
	// caller that cancelled, a refusal because the queue is full, a restart)
	// pauses the message's group. The group's later queued and waiting
	// messages, and every delivery of it that is not the retry it waits for,
	// are answered messages.GroupPausedError and never sent; the group then
	// admits the retries of those messages in the order it first delivered
	// them, and resumes once the last is in, on a resume, or GroupPauseMax
	// after its last pause. A grouped message needs an IdempotencyKey (else
	// messages.ErrNoIdempotencyKey, permanent): its retry is known by it.
	// Callers that retry each message answered without a final result, in
	// their own order, with the same key, see each group stored in the order
	// they first delivered it. One SQS limit remains: if one entry of a group
	// fails inside a request and a later entry of the same group in that
	// request is stored, that later entry precedes the retry; set MaxEntries
	// to 1 where that matters (a Pub/Sub Publish carries one ordering key and
	// succeeds or fails whole).
	StrictGroups bool
	// GroupPauseMax is how long a paused group (StrictGroups) stays paused
	// without a retry or a resume. Default DefaultGroupPauseMax (30s).
	GroupPauseMax time.Duration
	// Adaptive: the in-flight limit starts at 1 and moves between 1 and
	// MaxInflight by AIMD on request time: it grows while request time stays
	// near its no-load baseline, and falls by 10% when request time reaches
	// 1.3 times that baseline or the destination throttles (IsThrottled).
	Adaptive bool
}

// FullPolicy says what a destination does with a delivery that does not fit
// its queue's bounds.
type FullPolicy int

// The policies for a full queue.
const (
	Refuse FullPolicy = iota // a delivery that does not fit is answered *messages.RetryAfterError at once
	Block                    // it waits for room until its deadline
)

func (p FullPolicy) String() string {
	switch p {
	case Refuse:
		return "Refuse"
	case Block:
		return "Block"
	}
	return fmt.Sprintf("FullPolicy(%d)", int(p))
}

// Check reports the first field of t that no destination with limits lim
// accepts: a negative bound, a size above the limits, an unknown policy. The
// error names the field: "sinkbatch: Tuning.MaxEntries 11 is above the
// destination's limit 10". Codecs call it in their constructor, so a bad
// Tuning is refused before the first delivery.
//
// The error is permanent (IsPermanent): a delivery through a codec whose
// Tuning is refused is answered with it, and retrying cannot help.
func (t Tuning) Check(lim Limits) error {
	bad := func(field string, v any, why string) error {
		return Permanent(fmt.Errorf("sinkbatch: Tuning.%s %v %s", field, v, why))
	}
	// Every numeric field, in declaration order; the two with a ceiling
	// carry it.
	for _, f := range []struct {
		name    string
		v       int64
		shown   any
		ceiling int64 // 0: none
	}{
		{"MaxEntries", int64(t.MaxEntries), t.MaxEntries, int64(lim.MaxEntries)},
		{"MaxBytes", int64(t.MaxBytes), t.MaxBytes, int64(lim.MaxBytes)},
		{"Linger", int64(t.Linger), t.Linger, 0},
		{"MaxInflight", int64(t.MaxInflight), t.MaxInflight, 0},
		{"QueueMax", int64(t.QueueMax), t.QueueMax, 0},
		{"QueueMaxBytes", t.QueueMaxBytes, t.QueueMaxBytes, 0},
		{"TenantMax", int64(t.TenantMax), t.TenantMax, 0},
		{"RetryAfterMax", int64(t.RetryAfterMax), t.RetryAfterMax, 0},
		{"IdleTimeout", int64(t.IdleTimeout), t.IdleTimeout, 0},
		{"GroupPauseMax", int64(t.GroupPauseMax), t.GroupPauseMax, 0},
	} {
		switch {
		case f.v < 0:
			return bad(f.name, f.shown, "is negative")
		case f.ceiling > 0 && f.v > f.ceiling:
			return bad(f.name, f.shown, fmt.Sprintf("is above the destination's limit %d", f.ceiling))
		}
	}
	if t.WhenFull != Refuse && t.WhenFull != Block {
		return bad("WhenFull", t.WhenFull, "is not Refuse or Block")
	}
	if t.QueueMaxBytes > 0 && t.MaxBytes > 0 && t.QueueMaxBytes < int64(t.MaxBytes) {
		return bad("QueueMaxBytes", t.QueueMaxBytes, fmt.Sprintf("is below Tuning.MaxBytes %d: a full request could never be queued", t.MaxBytes))
	}
	if t.QueueMaxBytes > 0 && t.MaxBytes == 0 && lim.MaxBytes > 0 && t.QueueMaxBytes < int64(lim.MaxBytes) {
		return bad("QueueMaxBytes", t.QueueMaxBytes, fmt.Sprintf("is below the destination's request limit %d: set Tuning.MaxBytes to it or below", lim.MaxBytes))
	}
	return nil
}

// Defaults that a zero Tuning field takes. MaxEntries and MaxBytes default to
// the codec's Limits, MaxInflight to the instance's SinkConcurrency, and
// QueueMaxBytes to DefaultQueueMaxBytes or MaxBytes, whichever is larger.
const (
	DefaultLinger        = 5 * time.Millisecond
	DefaultQueueMax      = 4096
	DefaultQueueMaxBytes = 128 << 20
	DefaultTenantMax     = 1024
	DefaultRetryAfterMax = time.Second
	DefaultIdleTimeout   = time.Minute
	DefaultGroupPauseMax = 30 * time.Second
)

// Codec turns messages into one destination's requests. A codec value must
// not change its Identity, Limits or Tuning after its first delivery: the
// batcher caches them per codec value. Pointer codecs are cheapest to route.
//
// Codec values with the same Name and Identity are one destination: they
// share a batcher, which sends through the value that started it. A wrapper
// that changes what SendBatch does must therefore change Identity too.
//
// All methods must be safe for concurrent use: SendBatch runs on its own
// goroutine while the batcher calls Size.
type Codec interface {
	// Name is the codec's short kind, e.g. "sqs": it is part of actor names,
	// logs and the metric attribute "sink". It must not hold secrets.
	Name() string
	// Identity is everything that shapes the request (queue or topic,
	// endpoint, region, credentials, transport options, tuning). It may hold
	// secrets: sinkbatch only ever digests it with a keyed hash.
	Identity() []byte
	// Limits are the destination API's hard limits for one request.
	Limits() Limits
	// Tuning is the user's tuning; zero fields take defaults.
	Tuning() Tuning
	// Size is the number of bytes m adds to a request, as the destination
	// counts them toward Limits.MaxBytes.
	Size(m Message) int
	// SendBatch sends one request. It runs outside the batcher's mailbox and
	// must return when ctx is done. With a nil error it returns exactly one
	// Result per message, in order. An error wrapping ErrRefused means the
	// destination refused the whole request for its content (the batcher
	// bisects to find the message); any other error is the answer for every
	// message of the batch, permanent if IsPermanent says so. SendBatch
	// must not keep batch after it returns: the batcher reuses the slice.
	SendBatch(ctx context.Context, batch []Message) ([]Result, error)
}

// Validator is implemented by codecs that can tell, before a message is
// queued, that the destination can never accept it (an empty body, a
// character the destination refuses, a FIFO message without a group). The
// batcher calls Validate at admission and answers the delivery with its error
// at once, so a bad message never sinks a batch. The error should be
// permanent (see IsPermanent) and say what is wrong.
type Validator interface {
	Validate(m Message) error
}

// Describer is implemented by codecs that name their destination for
// tracing, as the OpenTelemetry messaging conventions do: System is the
// messaging.system ("aws_sqs", "gcp_pubsub"), Destination the
// messaging.destination.name (the queue or topic name; never a secret: it
// is put on every span). A codec without it, or whose Describe panics (the
// panic is logged), is traced under its Name().
type Describer interface {
	Describe() (system, destination string)
}

var (
	// ErrRefused is wrapped by a SendBatch error when the destination refused
	// the whole request for its content.
	ErrRefused = errors.New("sinkbatch: the destination refused the request")
	// ErrTooLarge is wrapped by the answer to a message whose Size alone
	// exceeds what one request may carry: Tuning.MaxBytes (which defaults
	// to, and may only tighten, Limits.MaxBytes), or a limit of the codec's
	// own (an SQS queue's MaximumMessageSize).
	ErrTooLarge = errors.New("sinkbatch: message too large")
	// ErrResultCount is wrapped by the answer to every message of a batch
	// whose SendBatch returned a result slice of the wrong length. The
	// request was made, so the messages may be stored: retryable, with the
	// same idempotency key.
	ErrResultCount = errors.New("sinkbatch: codec returned the wrong number of results")
	// ErrCodecPanic is wrapped by the answer to every message of a batch
	// whose SendBatch panicked (retryable: the request may have been made,
	// and the panic need not be the message's fault), and to a message whose
	// Size or Validate panicked (permanent: that message makes the codec
	// panic, and retrying it feeds the codec the same input). It is also
	// wrapped (retryable) by the answer to a message whose error from
	// SendBatch, or its batch's, cannot be read: a nil pointer (a typed nil
	// such as a nil *EntryError), or an error whose methods panic.
	ErrCodecPanic = errors.New("sinkbatch: codec panicked")
	// ErrThrottled is wrapped by a failure the destination reported as
	// "slow down" (SQS throttling, Pub/Sub ResourceExhausted). Retryable;
	// an adaptive destination lowers its in-flight limit on it.
	ErrThrottled = errors.New("sinkbatch: the destination asked to slow down")
)

// Permanent returns err marked permanent: IsPermanent reports true for it
// and for anything that wraps it; errors.Is and errors.As see err through
// it. Use it for a failure that retrying the same message cannot mend (a
// bad configuration, a message the destination can never take).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

type permanent struct{ error }

func (p permanent) Unwrap() error          { return p.error }
func (p permanent) PermanentFailure() bool { return true }

// IsThrottled reports whether err is or wraps ErrThrottled, or is an
// *EntryError with Throttled set.
func IsThrottled(err error) bool { return errors.Is(err, ErrThrottled) }

// EntryError is a failure reported by the destination (or the codec) for one
// message, or for every message of a request that failed as a whole.
type EntryError struct {
	Code      string // the destination's error code, e.g. "InvalidMessageContents"
	Message   string // the destination's text
	Permanent bool   // sending the same message again cannot succeed
	Throttled bool   // the destination asked to slow down (see IsThrottled)
}

// Is makes errors.Is(e, ErrThrottled) true for a throttling failure.
func (e *EntryError) Is(target error) bool { return e != nil && target == ErrThrottled && e.Throttled }

func (e *EntryError) Error() string {
	if e == nil {
		return "sinkbatch: a nil *codec.EntryError"
	}
	kind := "retryable"
	if e.Permanent {
		kind = "permanent"
	}
	if e.Message == "" {
		return fmt.Sprintf("sinkbatch: %s failure %s", kind, e.Code)
	}
	return fmt.Sprintf("sinkbatch: %s failure %s: %s", kind, e.Code, e.Message)
}

// IsPermanent reports whether sending the same message again cannot succeed:
// err is, or wraps, an *EntryError with Permanent set, ErrRefused (a refusal
// the batcher has narrowed down to this one message), ErrTooLarge, or an
// error whose PermanentFailure method says so (Permanent, a Tuning refused
// by Check, messages.ErrNilCodec, the answer to a message whose Size or
// Validate panicked). ErrCodecPanic from SendBatch and ErrResultCount are
// not permanent: the whole batch got them, whatever its messages hold, and
// the request may have been made.
//
// Where err's chain holds more than one of these, the first one met
// decides, in the order errors.Is walks the chain (outermost first, then
// each wrapped error depth first): Permanent(&EntryError{...}) is permanent,
// and so is a refusal that wraps the destination's retryable-looking code.
func IsPermanent(err error) bool {
	permanent, _ := classify(err)
	return permanent
}

// classify walks err's chain as errors.Is does and reports what its first
// classifying link says, and whether it met one.
func classify(err error) (permanent, decided bool) {
	for err != nil {
		switch e := err.(type) {
		case *EntryError:
			return e != nil && e.Permanent, true
		case interface{ PermanentFailure() bool }:
			return e.PermanentFailure(), true
		}
		if err == ErrRefused || err == ErrTooLarge {
			return true, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				if p, ok := classify(inner); ok {
					return p, true
				}
			}
			return false, false
		default:
			return false, false
		}
	}
	return false, false
}
