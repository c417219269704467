package batcher

import (
	"context"
	"encoding/hex"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file is a batcher's tracing, after the OpenTelemetry messaging
// conventions (as Google's Pub/Sub client follows them): a create span per
// delivery (PRODUCER), a child of the caller's span, from the front door's
// Deliver call (started and ended on the caller's goroutine, which spares
// the batcher's actor the work) or an actor's delivery's admission to its
// answer; a send span per request (CLIENT), bisections included, linked
// to the create spans of its messages, each of which links back to it. The
// message carries its create span's context to the consumer in
// codec.Message.Trace, which the codec writes and counts.

// The attribute keys of the messaging conventions, and sinkbatch's own.
const (
	attrSystem       = attribute.Key("messaging.system")
	attrDestination  = attribute.Key("messaging.destination.name")
	attrOpType       = attribute.Key("messaging.operation.type")
	attrOpName       = attribute.Key("messaging.operation.name")
	attrBatchCount   = attribute.Key("messaging.batch.message_count")
	attrMessageID    = attribute.Key("messaging.message.id")
	attrFlushTrigger = attribute.Key("sinkbatch.flush.trigger")
)

// tracing is what a batcher traces with; nil when the instance does not
// trace. Set in Started, never changed.
//
// The TracerProvider is user code (a sampler, a span processor, an exporter
// run inside Start and End): a panic in it is logged and costs the span,
// never a caller's answer, the batcher or the process.
//
// Attributes and links are set only on spans that record: a span its
// sampler dropped costs its start, its context and nothing more.
type tracing struct {
	log        *slog.Logger
	tracer     trace.Tracer
	createName string
	sendName   string
	create     []attribute.KeyValue
	send       []attribute.KeyValue
}

func newTracing(tracer trace.Tracer, c codec.Codec, sink string, log *slog.Logger) *tracing {
	system, destination := describe(c, sink, log)
	base := []attribute.KeyValue{attrSystem.String(system), attrDestination.String(destination)}
	return &tracing{
		log:        log,
		tracer:     tracer,
		createName: "create " + destination,
		sendName:   "send " + destination,
		create:     append(base[:2:2], attrOpType.String("create"), attrOpName.String("create")),
		send:       append(base[:2:2], attrOpType.String("send"), attrOpName.String("send")),
	}
}

// describe is the system and destination names of c's spans: its
// Describe, or sink for both if it has none or its Describe panics (logged).
// A batcher reads them as it starts: a panic there would restart it, and
// each restart panic again, before it ever took a delivery.
func describe(c codec.Codec, sink string, log *slog.Logger) (system, destination string) {
	d, ok := c.(codec.Describer)
	if !ok {
		return sink, sink
	}
	defer func() {
		if r := recover(); r != nil {
			log.Error("sinkbatch: codec panicked in Describe; its spans are named by the codec's Name", slog.Any("panic", r))
			system, destination = sink, sink
		}
	}()
	return d.Describe()
}

// recovered logs a panic of the TracerProvider's; what panicked is left
// undone.
func (t *tracing) recovered(what string) {
	if r := recover(); r != nil {
		t.log.Error("sinkbatch: the TracerProvider panicked", slog.String("in", what), slog.Any("panic", r))
	}
}

// recovered is tracing.recovered for code that has no tracing.
func recovered(log *slog.Logger, what string) {
	if r := recover(); r != nil {
		log.Error("sinkbatch: the TracerProvider panicked", slog.String("in", what), slog.Any("panic", r))
	}
}

// createName is the name a create span starts with where its destination
// is not yet known (the front door's Deliver starts it on the caller's
// goroutine); the batcher renames a recording one at admission.
const createName = "create"

// StartCreate starts the create span of a delivery made through the front
// door's Deliver, on the caller's goroutine, as a child of the span in ctx;
// it returns the span (nil if tracer panicked, logged to log) and the
// context its message carries. The caller ends it with EndCreate or
// AbandonCreate when it is answered or gives up; the batcher that admits
// the delivery names it after its destination and links it to its send.
func StartCreate(ctx context.Context, tracer trace.Tracer, log *slog.Logger) (span trace.Span, tc codec.TraceContext) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("sinkbatch: the TracerProvider panicked", slog.String("in", "create span start"), slog.Any("panic", r))
			span, tc = nil, codec.TraceContext{}
		}
	}()
	_, span = tracer.Start(ctx, createName, producer...)
	return span, traceContext(span.SpanContext())
}

// EndCreate ends a create span StartCreate started with the delivery's
// answer.
func EndCreate(span trace.Span, r codec.Result, log *slog.Logger) {
	defer recovered(log, "create span end")
	endCreate(span, r)
}

// AbandonCreate ends a create span StartCreate started, of a delivery whose
// caller stopped waiting.
func AbandonCreate(span trace.Span, log *slog.Logger) {
	defer recovered(log, "create span end")
	abandonCreate(span)
}

// producer and client are the span kinds of create and send spans.
var (
	producer = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	client   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// startCreate starts the create span of a delivery an actor sent, as a
// child of parent (a new trace when parent is not valid), and returns it
// with the context its message carries; nil and nothing if the provider
// panicked.
func (t *tracing) startCreate(parent trace.SpanContext) (span trace.Span, tc codec.TraceContext) {
	defer func() {
		if r := recover(); r != nil {
			t.log.Error("sinkbatch: the TracerProvider panicked", slog.String("in", "create span start"), slog.Any("panic", r))
			span, tc = nil, codec.TraceContext{}
		}
	}()
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	_, span = t.tracer.Start(ctx, t.createName, producer...)
	if span.IsRecording() {
		span.SetAttributes(t.create...)
	}
	return span, traceContext(span.SpanContext())
}

// admitCreate names a create span the caller started after the
// destination that admits it, and gives it the destination's attributes.
func (t *tracing) admitCreate(span trace.Span) {
	defer t.recovered("create span admission")
	if span.IsRecording() {
		span.SetName(t.createName)
		span.SetAttributes(t.create...)
	}
}

// endCreate ends a create span with the delivery's answer.
func (t *tracing) endCreate(span trace.Span, r codec.Result) {
	defer t.recovered("create span end")
	endCreate(span, r)
}

func endCreate(span trace.Span, r codec.Result) {
	if r.Err != nil {
		span.RecordError(r.Err)
		span.SetStatus(codes.Error, r.Err.Error())
	} else if span.IsRecording() {
		span.SetAttributes(attrMessageID.String(r.ID))
	}
	span.End()
}

// abandonCreate ends the create span of a delivery whose caller gave up
// before it was sent: nobody is answered.
func (t *tracing) abandonCreate(span trace.Span) {
	defer t.recovered("create span end")
	abandonCreate(span)
}

func abandonCreate(span trace.Span) {
	span.SetStatus(codes.Error, "the caller stopped waiting for its answer")
	span.End()
}

// startSend starts the send span of one request carrying entries, and links
// each entry's create span to it. If the provider panics, ctx is returned
// as it came, with no span.
func (t *tracing) startSend(ctx context.Context, trigger telemetry.Trigger, entries []*entry) (_ context.Context, span trace.Span) {
	in := ctx
	defer func() {
		if r := recover(); r != nil {
			t.log.Error("sinkbatch: the TracerProvider panicked", slog.String("in", "send span start"), slog.Any("panic", r))
			ctx, span = in, nil
		}
	}()
	ctx, span = t.tracer.Start(ctx, t.sendName, client...)
	if span.IsRecording() {
		span.SetAttributes(t.send...)
		span.SetAttributes(attrBatchCount.Int(len(entries)), attrFlushTrigger.String(trigger.String()))
		for _, e := range entries {
			if e.to.span != nil {
				span.AddLink(trace.Link{SpanContext: e.to.span.SpanContext()})
			}
		}
	}
	if sc := span.SpanContext(); sc.IsValid() {
		for _, e := range entries {
			if e.to.span != nil && e.to.span.IsRecording() {
				e.to.span.AddLink(trace.Link{SpanContext: sc})
			}
		}
	}
	return ctx, span
}

// endSend ends a send span with the request's outcome.
func (t *tracing) endSend(span trace.Span, err error) {
	defer t.recovered("send span end")
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// traceContext is sc in its W3C header form, for the message to carry; the
// zero value when sc is not valid.
func traceContext(sc trace.SpanContext) codec.TraceContext {
	if !sc.IsValid() {
		return codec.TraceContext{}
	}
	// One allocation: "00-" trace id "-" span id "-" flags.
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	copy(b[52:], "-00")
	if sc.IsSampled() {
		b[54] = '1'
	}
	return codec.TraceContext{Parent: string(b[:]), State: sc.TraceState().String()}
}
