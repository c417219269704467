package pubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/codec"
)

// CodeMissingResult is the Code of the retryable *codec.EntryError a message
// gets when Pub/Sub's answer gives it no message id: an answer with more or
// fewer ids than the request's messages (the error then also wraps
// codec.ErrResultCount), or an empty id. The request reached the server, so the message may have been
// stored; retry it with the same idempotency key.
const CodeMissingResult = "MissingResult"

// SendBatch publishes batch and returns one Result per message, in order,
// each with the message id Pub/Sub assigned.
//
// When every message is valid and they share one ordering key, SendBatch
// makes exactly one Publish call and a failure is the answer for the whole
// batch: an error wrapping codec.ErrRefused for InvalidArgument (nothing was
// published; the batcher bisects), otherwise an error that is, or wraps, a
// *codec.EntryError classified as the package doc says. A batch over
// Pub/Sub's request limits is refused the same way without a call.
//
// Otherwise (several ordering keys, which one request may not mix, or
// messages Validate refuses) SendBatch returns a nil error and per-message
// errors: invalid messages get their Validate error and are not sent; each
// ordering key's messages go in their own request, and a refused request is
// bisected here, since its siblings may already be published.
//
// SendBatch returns when ctx is done; the messages of a call cut short get
// a retryable error that wraps ctx.Err().
func (c *Codec) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if len(batch) == 0 {
		return []codec.Result{}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, c.classify(ctx, err)
	}
	results := make([]codec.Result, len(batch))
	var (
		parts   [][]int // message indexes by ordering key, in first-seen order
		byKey   map[string]int
		invalid bool
		bytes   = topicOverhead(c.topic)
	)
	for i, m := range batch {
		if err := c.Validate(m); err != nil {
			results[i].Err = err
			invalid = true
			continue
		}
		bytes += c.Size(m)
		switch {
		case len(parts) == 0:
			// Room for the common case, one ordering key, from the start.
			parts = [][]int{append(make([]int, 0, len(batch)-i), i)}
			continue
		case len(parts) == 1 && batch[parts[0][0]].Group == m.Group:
			parts[0] = append(parts[0], i) // the common case: no map
			continue
		case byKey == nil:
			byKey = map[string]int{batch[parts[0][0]].Group: 0}
		}
		p, ok := byKey[m.Group]
		if !ok {
			p = len(parts)
			byKey[m.Group] = p
			parts = append(parts, nil)
		}
		parts[p] = append(parts[p], i)
	}
	if n := len(batch); n > MaxRequestMessages || bytes > MaxRequestBytes {
		// Pub/Sub would refuse this request with InvalidArgument; do so
		// without sending it, so the batcher bisects.
		return nil, fmt.Errorf("sinkbatch/pubsub: %d messages in %d bytes exceed Pub/Sub's request limits (%d messages, %d bytes): %w",
			n, bytes, MaxRequestMessages, MaxRequestBytes, codec.ErrRefused)
	}
	if !invalid && len(parts) == 1 {
		if err := c.publish(ctx, batch, parts[0], results); err != nil {
			return nil, err
		}
		return results, nil
	}

	// Several requests: each key's messages in order, keys in parallel.
	sem := make(chan struct{}, maxParallelPublishes)
	var wg sync.WaitGroup
	for _, idx := range parts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.publishBisecting(ctx, batch, idx, results)
		}()
	}
	wg.Wait()
	return results, nil
}

// publishBisecting publishes batch[idx...] and, when Pub/Sub refuses the
// request for its content, publishes each half in turn until the refused
// messages stand alone. For an ordering key, a half that fails for any other
// reason ends the key's requests: later messages would otherwise overtake it.
// It reports whether the caller may go on with the key's later messages.
func (c *Codec) publishBisecting(ctx context.Context, batch []codec.Message, idx []int, results []codec.Result) bool {
	err := c.publish(ctx, batch, idx, results)
	if err == nil {
		// A message answered without an id may not be stored: the key's
		// later messages would overtake it.
		for _, i := range idx {
			if results[i].Err != nil {
				return batch[idx[0]].Group == ""
			}
		}
		return true
	}
	if !errors.Is(err, codec.ErrRefused) || len(idx) == 1 {
		for _, i := range idx {
			results[i].Err = err
		}
		return batch[idx[0]].Group == "" || errors.Is(err, codec.ErrRefused)
	}
	mid := len(idx) / 2
	if !c.publishBisecting(ctx, batch, idx[:mid], results) {
		stopped := fmt.Errorf("sinkbatch/pubsub: not sent after an earlier message of ordering key %q failed: %w",
			batch[idx[0]].Group, &codec.EntryError{Code: "OrderingKeyFailed", Message: "an earlier message of the key failed"})
		for _, i := range idx[mid:] {
			results[i].Err = stopped
		}
		return false
	}
	return c.publishBisecting(ctx, batch, idx[mid:], results)
}

// publish sends batch[idx...] in one Publish call and fills their Results'
// IDs, or returns the call's classified error.
func (c *Codec) publish(ctx context.Context, batch []codec.Message, idx []int, results []codec.Result) error {
	// One allocation for the request's messages, not one each.
	protos := make([]pubsubpb.PubsubMessage, len(idx))
	msgs := make([]*pubsubpb.PubsubMessage, len(idx))
	for j, i := range idx {
		msgs[j] = &protos[j]
		c.fillProto(msgs[j], batch[i])
	}
	opts := c.callOpts
	if c.compressAbove > 0 && c.requestSize(batch, idx) > c.compressAbove {
		opts = c.gzipOpts
	}
	resp, err := c.client.Publish(ctx, &pubsubpb.PublishRequest{Topic: c.topic, Messages: msgs}, opts...)
	if err != nil {
		return c.classify(ctx, err)
	}
	// An answer without an id for a message is no acknowledgement: the
	// request reached the server, so the message may have been stored, and
	// a retry with the same idempotency key is the safe answer.
	if len(resp.GetMessageIds()) != len(idx) {
		return &publishError{topic: c.topic, cause: codec.ErrResultCount, entry: &codec.EntryError{
			Code: CodeMissingResult,
			Message: fmt.Sprintf("Pub/Sub answered %d message ids for %d messages; the messages may have been stored",
				len(resp.GetMessageIds()), len(idx)),
		}}
	}
	for j, i := range idx {
		if id := resp.MessageIds[j]; id != "" {
			results[i].ID = id
			continue
		}
		results[i].Err = &publishError{topic: c.topic, entry: &codec.EntryError{
			Code:    CodeMissingResult,
			Message: "Pub/Sub answered success without a message id; the message may have been stored",
		}}
	}
	return nil
}

// requestSize is the serialized size of the PublishRequest for
// batch[idx...].
func (c *Codec) requestSize(batch []codec.Message, idx []int) int {
	n := topicOverhead(c.topic)
	for _, i := range idx {
		n += c.Size(batch[i])
	}
	return n
}

// fillProto maps m onto the empty PubsubMessage p. It shares m's Body and,
// without an idempotency key or a trace context to add, its Attributes: the
// request only reads them. Size counts exactly what this writes.
func (c *Codec) fillProto(p *pubsubpb.PubsubMessage, m codec.Message) {
	attrs := m.Attributes
	parent, state := c.traceCarried(m)
	if c.propagate && m.Trace.Parent != "" && (parent == "" || state != m.Trace.State) {
		c.traceDropped.Add(1)
	}
	if m.IdempotencyKey != "" || parent != "" {
		attrs = make(map[string]string, len(m.Attributes)+3)
		for k, v := range m.Attributes {
			attrs[k] = v
		}
		if m.IdempotencyKey != "" {
			attrs[c.idemAttr] = m.IdempotencyKey
		}
		if parent != "" {
			// The message's trace context replaces any the user's
			// attributes carry, tracestate included: a stale tracestate
			// must not travel with a new traceparent.
			delete(attrs, TraceStateAttribute)
			attrs[TraceParentAttribute] = parent
			if state != "" {
				attrs[TraceStateAttribute] = state
			}
		}
	}
	p.Data, p.Attributes, p.OrderingKey = m.Body, attrs, m.Group
}

// Whole-request failures by gRPC code; see "Errors" in the package doc.
var permanentCodes = map[codes.Code]bool{
	codes.NotFound:           true,
	codes.PermissionDenied:   true,
	codes.Unauthenticated:    true,
	codes.FailedPrecondition: true,
	codes.Unimplemented:      true,
}

// classify turns a Publish error into the answer for its messages.
func (c *Codec) classify(ctx context.Context, err error) error {
	code := status.Code(err)
	var ctxErr error
	switch {
	case code != codes.Canceled && code != codes.DeadlineExceeded && code != codes.Unknown:
		// The server answered: its verdict stands even if ctx ended since.
	case ctx.Err() != nil:
		ctxErr = ctx.Err()
	case code == codes.DeadlineExceeded:
		// gRPC sends the deadline along, and the server's timer can
		// answer before ctx's own timer has marked ctx done.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			ctxErr = context.DeadlineExceeded
		}
	}
	if ctxErr != nil {
		code := codes.Canceled
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			code = codes.DeadlineExceeded
		}
		pe := &publishError{topic: c.topic, entry: &codec.EntryError{Code: code.String(), Message: ctxErr.Error()}, cause: ctxErr}
		if err != ctxErr {
			pe.rpc = err
		}
		return pe
	}
	st, _ := status.FromError(err)
	if st.Code() == codes.InvalidArgument || isSizeLimit(st) {
		return fmt.Errorf("sinkbatch/pubsub: publish to %s refused: %w (%w)", c.topic, codec.ErrRefused, err)
	}
	return &publishError{topic: c.topic, rpc: err, entry: &codec.EntryError{
		Code:      st.Code().String(),
		Message:   st.Message(),
		Permanent: permanentCodes[st.Code()],
		// The service's quota or flow control: slow down, then retry.
		Throttled: st.Code() == codes.ResourceExhausted,
	}}
}

// isSizeLimit reports whether st is gRPC's own message-size limit ("grpc:
// received message larger than max (N vs. M)" from a server with a receive
// limit below Pub/Sub's 10 MB, such as an emulator's 4 MiB; "trying to send
// message larger than max" from a client option) rather than the service
// asking to slow down. Both come as ResourceExhausted. The request was not
// processed and a smaller one passes, so it is a refusal for content: the
// batcher bisects, and a message too large on its own is answered
// permanently. A response over the client's receive limit would read alike,
// but the client's limit is far above any PublishResponse.
func isSizeLimit(st *status.Status) bool {
	return st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max")
}

// publishError is a failed Publish call: the classified *codec.EntryError,
// the gRPC error (for status.Code) and, when ctx ended the call, ctx.Err().
type publishError struct {
	topic string
	entry *codec.EntryError
	rpc   error
	cause error
}

func (e *publishError) Error() string {
	kind := "retryable"
	switch {
	case e.entry.Permanent:
		kind = "permanent"
	case e.entry.Throttled:
		kind = "retryable, throttled"
	}
	return fmt.Sprintf("sinkbatch/pubsub: publish to %s: %s (%s): %s", e.topic, e.entry.Code, kind, e.entry.Message)
}

func (e *publishError) Unwrap() []error {
	errs := []error{e.entry}
	if e.rpc != nil {
		errs = append(errs, e.rpc)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}
