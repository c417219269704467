package clustered

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// sentinels are the error values a caller may branch on with errors.Is, in
// the form they travel. An owner records each one its error matches; the
// caller's copy matches the same ones.
var sentinels = []struct {
	wire clusterpb.Sentinel
	err  error
}{
	{clusterpb.Sentinel_SENTINEL_STOPPED, messages.ErrStopped},
	{clusterpb.Sentinel_SENTINEL_BATCHER_DOWN, messages.ErrBatcherDown},
	{clusterpb.Sentinel_SENTINEL_NIL_CODEC, messages.ErrNilCodec},
	{clusterpb.Sentinel_SENTINEL_DEADLINE_EXCEEDED, context.DeadlineExceeded},
	{clusterpb.Sentinel_SENTINEL_CANCELED, context.Canceled},
	{clusterpb.Sentinel_SENTINEL_TOO_LARGE, codec.ErrTooLarge},
	{clusterpb.Sentinel_SENTINEL_REFUSED, codec.ErrRefused},
	{clusterpb.Sentinel_SENTINEL_CODEC_PANIC, codec.ErrCodecPanic},
	{clusterpb.Sentinel_SENTINEL_RESULT_COUNT, codec.ErrResultCount},
	{clusterpb.Sentinel_SENTINEL_THROTTLED, codec.ErrThrottled},
	{clusterpb.Sentinel_SENTINEL_UNKNOWN_DESTINATION, ErrUnknownDestination},
	{clusterpb.Sentinel_SENTINEL_UNREACHABLE, ErrUnreachable},
	{clusterpb.Sentinel_SENTINEL_NOT_DELIVER, messages.ErrNotDeliver},
	{clusterpb.Sentinel_SENTINEL_NIL_CONTEXT, actors.ErrNilContext},
}

// encodeError is err in its wire form: its text, every sentinel it wraps,
// whether codec.IsPermanent holds, and the fields of the typed errors in its
// chain. nil stays nil.
func encodeError(err error) *clusterpb.Error {
	if err == nil {
		return nil
	}
	w := &clusterpb.Error{Text: clip(err.Error()), Permanent: codec.IsPermanent(err)}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			w.Sentinels = append(w.Sentinels, s.wire)
		}
	}
	var ra *messages.RetryAfterError
	if errors.As(err, &ra) {
		w.RetryAfter = &clusterpb.RetryAfter{AfterNanos: int64(ra.After), Reason: int32(ra.Reason)}
	}
	var ee *codec.EntryError
	if errors.As(err, &ee) {
		w.Entry = &clusterpb.EntryError{Code: clip(ee.Code), Message: clip(ee.Message), Permanent: ee.Permanent, Throttled: ee.Throttled}
	}
	var gp *messages.GroupPausedError
	if errors.As(err, &gp) {
		w.GroupPaused = &clusterpb.GroupPaused{Group: gp.Group, Key: gp.Key, AfterNanos: int64(gp.After)}
	}
	return w
}

// decodeError is the caller's copy of an owner's error. nil stays nil.
func decodeError(w *clusterpb.Error) error {
	if w == nil {
		return nil
	}
	e := &remoteError{text: w.Text, permanent: w.Permanent}
	for _, s := range w.Sentinels {
		for _, known := range sentinels {
			if known.wire == s {
				e.is = append(e.is, known.err)
			}
		}
	}
	if ra := w.RetryAfter; ra != nil {
		e.retryAfter = &messages.RetryAfterError{After: time.Duration(ra.AfterNanos), Reason: messages.FullReason(ra.Reason)}
	}
	if ee := w.Entry; ee != nil {
		e.entry = &codec.EntryError{Code: ee.Code, Message: ee.Message, Permanent: ee.Permanent, Throttled: ee.Throttled}
	}
	if gp := w.GroupPaused; gp != nil {
		e.paused = &messages.GroupPausedError{Group: gp.Group, Key: gp.Key, After: time.Duration(gp.AfterNanos)}
	}
	return e
}

// remoteError is an error an owner answered with, as its caller sees it:
// the same text, errors.Is true for the same sentinels, errors.As finding
// the same typed errors with the same fields, and codec.IsPermanent giving
// the same answer.
type remoteError struct {
	text       string
	is         []error
	permanent  bool
	retryAfter *messages.RetryAfterError
	entry      *codec.EntryError
	paused     *messages.GroupPausedError
}

func (e *remoteError) Error() string { return e.text }

// Is reports whether the owner's error matched target.
func (e *remoteError) Is(target error) bool {
	for _, s := range e.is {
		if s == target {
			return true
		}
	}
	return false
}

// As fills the typed errors the owner's error held.
func (e *remoteError) As(target any) bool {
	switch t := target.(type) {
	case **messages.RetryAfterError:
		if e.retryAfter != nil {
			c := *e.retryAfter
			*t = &c
			return true
		}
	case **codec.EntryError:
		if e.entry != nil {
			c := *e.entry
			*t = &c
			return true
		}
	case **messages.GroupPausedError:
		if e.paused != nil {
			c := *e.paused
			*t = &c
			return true
		}
	}
	return false
}

// PermanentFailure carries codec.IsPermanent's answer on the owner.
func (e *remoteError) PermanentFailure() bool { return e.permanent }

// wireSize is the most bytes q takes in a DeliverBatch: its fields, their
// tags and lengths, its budget, call and parent span.
func wireSize(q queuedDelivery) int {
	m := &q.message
	n := 96 + len(m.Body) + len(m.Tenant) + len(m.Group) + len(m.IdempotencyKey) + len(m.Trace.Parent) + len(m.Trace.State)
	for k, v := range m.Attributes {
		n += 16 + len(k) + len(v)
	}
	if q.parent != nil {
		n += len(q.parent.State)
	}
	return n
}

// replySize is the most bytes r takes in a DeliverReplies.
func replySize(r *clusterpb.DeliverReply) int {
	n := 32 + len(r.Id) + len(r.Sequence)
	if r.Error != nil {
		n += 8 + proto.Size(r.Error)
	}
	return n
}

// maxErrorText bounds the texts of an error on the wire: a codec's error
// may quote a whole response, and answers share a budget (see boxes).
const maxErrorText = 8 << 10

// clip is s, cut to maxErrorText bytes.
func clip(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return s[:maxErrorText] + " [cut]"
}

// toWire fills r with m.
func toWire(r *clusterpb.DeliverRequest, m codec.Message) {
	r.Tenant, r.Group, r.IdempotencyKey = m.Tenant, m.Group, m.IdempotencyKey
	r.Body, r.Attributes = m.Body, m.Attributes
	r.TraceParent, r.TraceState = m.Trace.Parent, m.Trace.State
}

// fromWire is the message r carries.
func fromWire(r *clusterpb.DeliverRequest) codec.Message {
	return codec.Message{
		Tenant:         r.Tenant,
		Group:          r.Group,
		IdempotencyKey: r.IdempotencyKey,
		Body:           r.Body,
		Attributes:     r.Attributes,
		Trace:          codec.TraceContext{Parent: r.TraceParent, State: r.TraceState},
	}
}

// spanToWire is sc in its wire form; nil when sc is not valid.
func spanToWire(sc trace.SpanContext) *clusterpb.SpanContext {
	if !sc.IsValid() {
		return nil
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	return &clusterpb.SpanContext{TraceId: tid[:], SpanId: sid[:], Flags: uint32(sc.TraceFlags()), State: sc.TraceState().String()}
}

// spanFromWire is the span context w carries, marked remote if it came from
// another member; the zero SpanContext when w is nil or malformed (the
// delivery then starts a new trace).
func spanFromWire(w *clusterpb.SpanContext, remote bool) trace.SpanContext {
	if w == nil || len(w.TraceId) != len(trace.TraceID{}) || len(w.SpanId) != len(trace.SpanID{}) {
		return trace.SpanContext{}
	}
	cfg := trace.SpanContextConfig{TraceFlags: trace.TraceFlags(w.Flags), Remote: remote}
	copy(cfg.TraceID[:], w.TraceId)
	copy(cfg.SpanID[:], w.SpanId)
	if ts, err := trace.ParseTraceState(w.State); err == nil {
		cfg.TraceState = ts
	}
	sc := trace.NewSpanContext(cfg)
	if !sc.IsValid() {
		return trace.SpanContext{}
	}
	return sc
}
