// Package telemetry is the seam through which batchers report what they do,
// and its OpenTelemetry implementation. An application gets the metrics below
// by giving actors.Config.MeterProvider an OpenTelemetry metric.MeterProvider,
// and the spans under Tracing by giving actors.Config.TracerProvider a
// trace.TracerProvider; sinkbatch never uses the global providers.
//
// # The seam
//
// A batcher holds a [Recorder] and, when it starts, asks it for the
// [SinkRecorder] of its codec kind ([Recorder.Sink] with Codec.Name()). It
// then reports each batch it sends ([SinkRecorder.Flushed]) and each delivery
// its queue refuses ([SinkRecorder.Refused]); if the SinkRecorder is also a
// [DeliveryRecorder], each delivery it answers ([DeliveryRecorder.Answered])
// and each entry's wait in the queue ([DeliveryRecorder.Waited]). They are
// called from actors' Receive and from request goroutines, so
// implementations are safe for concurrent use and never block. [Nop] records nothing, for an instance
// given no MeterProvider.
//
// # OpenTelemetry
//
// [New] builds an [OTel] from a metric.MeterProvider the caller passes in. The
// package uses only the OpenTelemetry metric API; it never reads or sets the
// global MeterProvider, so which SDK, readers and exporters are used is the
// application's choice alone.
//
// Every instrument carries the attribute instance (the name given to New).
// The flush and refused instruments also carry sink (Codec.Name(), such as
// "sqs" or "pubsub"):
//
//	instrument                           kind               unit        extra attributes
//	ankusa.sink_batch.flush.entries      int64 histogram    {entry}     trigger
//	ankusa.sink_batch.flush.bytes        int64 histogram    By          trigger
//	ankusa.sink_batch.flush.duration     float64 histogram  s           trigger
//	ankusa.sink_batch.flush.requests     int64 counter      {request}   -
//	ankusa.sink_batch.flush.bisections   int64 counter      {request}   -
//	ankusa.sink_batch.refused            int64 counter      {delivery}  reason
//	ankusa.sink_batch.deliveries         int64 counter      {delivery}  outcome
//	ankusa.sink_batch.queue.wait         float64 histogram  s           -
//	ankusa.sink_batch.batchers           int64 gauge        {batcher}   - (no sink)
//	ankusa.sink_batch.queued             int64 gauge        {entry}     - (no sink)
//	ankusa.sink_batch.queued_bytes       int64 gauge        By          - (no sink)
//	ankusa.sink_batch.inflight           int64 gauge        {request}   - (no sink)
//	ankusa.sink_batch.inflight.limit     int64 gauge        {request}   destination
//
// What they mean:
//
//   - flush.entries and flush.bytes: the entries in one batch and their
//     encoded size. Buckets: entries 1, 2, 5, 10, 20, 50, 100, 200, 500,
//     1000; bytes powers of 4 from 256 B to 16 MiB.
//   - flush.duration: from a batch's first request to its last answer, in
//     seconds, bisections included. Buckets 1 ms to 10 s.
//   - trigger says why the batch went out: "entries" (it reached MaxEntries),
//     "bytes" (it reached MaxBytes), "linger" (Linger passed) or "drain" (the
//     instance is stopping). A batch histogram's count is the number of
//     batches sent.
//   - flush.requests: requests sent for batches, bisections included, so
//     requests divided by the flush.entries count is the mean requests per
//     batch; it is 1 when nothing had to be bisected.
//   - flush.bisections: the extra requests spent isolating messages a
//     destination refused for their content. A steady rate means some
//     producer keeps sending something the destination will not take.
//   - refused: deliveries answered with a messages.RetryAfterError because
//     the destination's queue was full; reason names the bound: "entries"
//     (QueueMax), "bytes" (QueueMaxBytes) or "tenant" (TenantMax).
//   - deliveries: every delivery a batcher answered, by outcome: "ok",
//     "refused" (RetryAfterError), "permanent" (codec.IsPermanent),
//     "retryable", "deadline" (the caller's deadline passed), "down"
//     (ErrBatcherDown) or "stopped" (ErrStopped). Answers the front door
//     gives before a batcher sees the delivery (a nil codec, a refused
//     configuration, an instance already stopped) are not counted.
//   - queue.wait: from a delivery's admission to the start of the request
//     that carries it, in seconds; one sample per entry sent. Buckets
//     100 µs to 10 s.
//   - batchers, queued, queued_bytes and inflight: the instance's running
//     batchers, the entries and bytes they hold and their requests in
//     flight, read at each collection from the
//     gauges func given to New. [Gauges] describes the whole instance, so
//     these carry instance only, not sink. [OTel.Close] unregisters the
//     callback; until then the func must stay safe to call.
//   - inflight.limit: each destination with Tuning.Adaptive, its current
//     in-flight limit, with instance, sink and destination (the codec kind
//     and a keyed digest of its identity: no secret). A batcher reports it
//     through [LimitRecorder], which the sink recorders implement; a
//     batcher that stops removes its series.
//
// Recording costs no allocation of its own: [OTel.Sink] builds the attribute
// sets for each trigger, reason and outcome once per sink kind and caches
// the recorder, so Flushed, Refused, Answered and Waited only hand prebuilt
// options to the SDK.
//
// # Tracing
//
// With actors.Config.TracerProvider set (nil: no spans), sinkbatch follows
// the OpenTelemetry messaging conventions, as Google's Pub/Sub client does:
//
//   - a create span per delivery (kind PRODUCER), a child of the span in the
//     ctx given to Deliver (in the actor form, of
//     messages.Deliver.SpanContext), until the caller is answered:
//     messaging.message.id on success, an error status otherwise. Deliver
//     starts and ends it on the caller's goroutine, off the batcher's actor,
//     under the name "create", which the batcher changes to
//     "create <destination>" at admission if the span records: a sampler
//     sees the name "create". The actor form's create span starts at
//     admission, in the batcher.
//   - a send span per request (kind CLIENT), bisections included, with
//     messaging.batch.message_count and sinkbatch.flush.trigger, linked to
//     each of its messages' create spans, each of which links back to it.
//   - both carry messaging.system ("aws_sqs", "gcp_pubsub"; a custom codec's
//     Name unless it implements codec.Describer, or its Describe panics),
//     messaging.destination.name (the queue or topic name, never the
//     identity) and messaging.operation.type.
//
// Each message carries its create span's context to its consumer
// (codec.Message.Trace): Pub/Sub in the googclient_traceparent and
// googclient_tracestate attributes Google's subscriber reads; SQS in the
// AWSTraceHeader system attribute (X-Ray format, none of the 10 message
// attributes spent), or as W3C traceparent attributes with
// sqs.Config.TracePropagation. What is carried counts in Size and in the
// attribute limits; each codec can turn it off, and the codec packages say
// how it is counted. Attributes and links are set only on spans that record,
// so a sampler that drops a span leaves its start and its context as the
// whole cost.
//
// # Exporting to Prometheus
//
// The OpenTelemetry Prometheus exporter
// (go.opentelemetry.io/otel/exporters/prometheus) is a metric reader: the
// application builds a MeterProvider around it and passes that provider to
// the instance, which calls New with it:
//
//	reg := prometheus.NewRegistry() // github.com/prometheus/client_golang
//	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
//	if err != nil { ... }
//	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
//	defer mp.Shutdown(ctx)
//	// pass mp to the instance's options
//	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Without WithRegisterer the exporter registers with
// prometheus.DefaultRegisterer, a global; pass a registry as above. The
// exporter rewrites names in Prometheus style: dots become underscores, a
// known unit adds a suffix unless the name already ends with it, and counters
// end in _total. With the exporter version in go.mod (v0.69.0) that gives,
// for example, ankusa_sink_batch_flush_duration_seconds_bucket,
// ankusa_sink_batch_flush_bytes_bucket, ankusa_sink_batch_queued_bytes and
// ankusa_sink_batch_refused_total; units in braces such as {entry} add no
// suffix. go run ./cmd/demo -metrics-addr 127.0.0.1:9464 serves them.
package telemetry
