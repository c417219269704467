package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ankusa/sinkbatch/messages"
)

// ScopeName is the instrumentation scope of the meter New takes from its
// MeterProvider.
const ScopeName = "github.com/ankusa/sinkbatch/telemetry"

// The instruments' names. They are part of the package's contract: dashboards
// and alerts are written against them.
const (
	MetricFlushEntries    = "ankusa.sink_batch.flush.entries"
	MetricFlushBytes      = "ankusa.sink_batch.flush.bytes"
	MetricFlushRequests   = "ankusa.sink_batch.flush.requests"
	MetricFlushBisections = "ankusa.sink_batch.flush.bisections"
	MetricFlushDuration   = "ankusa.sink_batch.flush.duration"
	MetricRefused         = "ankusa.sink_batch.refused"
	MetricBatchers        = "ankusa.sink_batch.batchers"
	MetricQueued          = "ankusa.sink_batch.queued"
	MetricQueuedBytes     = "ankusa.sink_batch.queued_bytes"
	MetricDeliveries      = "ankusa.sink_batch.deliveries"
	MetricQueueWait       = "ankusa.sink_batch.queue.wait"
	MetricInflight        = "ankusa.sink_batch.inflight"
)

// The attribute keys the instruments carry.
const (
	AttrInstance = attribute.Key("instance") // the instance name given to New
	AttrSink     = attribute.Key("sink")     // Codec.Name() of the batch's destination
	AttrTrigger  = attribute.Key("trigger")  // Trigger.String()
	AttrReason   = attribute.Key("reason")   // messages.FullReason.String()
	AttrOutcome  = attribute.Key("outcome")  // Outcome.String()
)

// Histogram bucket boundaries. The SDK's default boundaries (0 … 10000) fit
// none of these quantities: a batch holds at most a few hundred entries,
// weighs up to a few MiB and takes milliseconds to seconds.
var (
	// entriesBuckets covers 1 entry up to Pub/Sub's 1000-message batch.
	entriesBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}
	// bytesBuckets are powers of 4 from 256 B to 16 MiB: past SQS's 1 MiB
	// batch and Pub/Sub's 10 MB request.
	bytesBuckets = []float64{256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20}
	// durationBuckets run from 1 ms to 10 s in 1-2.5-5 steps.
	durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	// waitBuckets run from 100 µs (a full batch leaves at once) to 10 s.
	waitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// The trigger and reason values a SinkRecorder precomputes attributes for,
// in value order from zero. Values outside these ranges are still recorded, at the cost of building
// their attribute set on each call.
var (
	triggers = [...]Trigger{TriggerEntries, TriggerBytes, TriggerLinger, TriggerDrain}
	reasons  = [...]messages.FullReason{messages.FullEntries, messages.FullBytes, messages.FullTenant}
	outcomes = [...]Outcome{OutcomeOK, OutcomeRefused, OutcomePermanent, OutcomeRetryable, OutcomeDeadline, OutcomeDown, OutcomeStopped}
)

// OTel is a Recorder that reports to OpenTelemetry instruments taken from the
// MeterProvider given to New. It is safe for concurrent use.
type OTel struct {
	instance string

	entries    metric.Int64Histogram
	bytes      metric.Int64Histogram
	requests   metric.Int64Counter
	bisections metric.Int64Counter
	duration   metric.Float64Histogram
	refused    metric.Int64Counter
	deliveries metric.Int64Counter
	wait       metric.Float64Histogram

	mu    sync.Mutex
	sinks map[string]*sinkRecorder // one per codec kind: it grows only to the number of codecs linked in
	reg   metric.Registration      // nil once Close has run, or if New had no gauges func

	limits   map[limitKey]int    // adaptive destinations' in-flight limits (limit.go)
	limitReg metric.Registration // nil once Close has run
}

// New returns a Recorder that reports through meters from mp, labelling every
// instrument with instance. It never reads or sets the global MeterProvider;
// a nil mp is an error, since the caller meant to record somewhere.
//
// If gauges is not nil, New registers a callback that calls it at each
// collection to report the batchers, queued and queued_bytes gauges; gauges
// must be safe for concurrent use and quick, since the SDK calls it on its
// collecting goroutine. Close unregisters the callback. If gauges is nil, the
// gauges are not reported.
//
// If the provider reports an error for an instrument, New returns it and no
// OTel; nothing stays registered.
func New(mp metric.MeterProvider, instance string, gauges func() Gauges) (*OTel, error) {
	if mp == nil {
		return nil, errors.New("sinkbatch: telemetry: nil MeterProvider")
	}
	m := mp.Meter(ScopeName)
	o := &OTel{instance: instance, sinks: make(map[string]*sinkRecorder)}

	var errs [8]error
	o.entries, errs[0] = m.Int64Histogram(MetricFlushEntries,
		metric.WithUnit("{entry}"),
		metric.WithDescription("Entries per batch sent, by what triggered the send."),
		metric.WithExplicitBucketBoundaries(entriesBuckets...))
	o.bytes, errs[1] = m.Int64Histogram(MetricFlushBytes,
		metric.WithUnit("By"),
		metric.WithDescription("Encoded bytes per batch sent, by what triggered the send."),
		metric.WithExplicitBucketBoundaries(bytesBuckets...))
	o.requests, errs[2] = m.Int64Counter(MetricFlushRequests,
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests sent for batches, bisections included."))
	o.bisections, errs[3] = m.Int64Counter(MetricFlushBisections,
		metric.WithUnit("{request}"),
		metric.WithDescription("Extra requests spent isolating messages the destination refused."))
	o.duration, errs[4] = m.Float64Histogram(MetricFlushDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Time from a batch's first request to its last answer, by what triggered the send."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.refused, errs[5] = m.Int64Counter(MetricRefused,
		metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries refused because the destination's queue was full, by the bound that refused them."))
	o.deliveries, errs[6] = m.Int64Counter(MetricDeliveries,
		metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries a batcher answered, by outcome."))
	o.wait, errs[7] = m.Float64Histogram(MetricQueueWait,
		metric.WithUnit("s"),
		metric.WithDescription("Time from a delivery's admission to the start of the request that carries it."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("sinkbatch: telemetry: %w", err)
	}

	limitReg, err := o.registerLimit(m)
	if err != nil {
		return nil, fmt.Errorf("sinkbatch: telemetry: %w", err)
	}
	o.limitReg = limitReg
	if gauges != nil {
		reg, err := registerGauges(m, instance, gauges)
		if err != nil {
			_ = o.unregister(&o.limitReg)
			return nil, fmt.Errorf("sinkbatch: telemetry: %w", err)
		}
		o.reg = reg
	}
	return o, nil
}

// registerGauges creates the observable gauges and the callback that reports
// them. The gauges describe a whole instance (Gauges has no per-sink
// breakdown), so they carry the instance attribute only.
func registerGauges(m metric.Meter, instance string, gauges func() Gauges) (metric.Registration, error) {
	batchers, err1 := m.Int64ObservableGauge(MetricBatchers,
		metric.WithUnit("{batcher}"),
		metric.WithDescription("Batchers running in the instance, one per destination with queued or in-flight work."))
	queued, err2 := m.Int64ObservableGauge(MetricQueued,
		metric.WithUnit("{entry}"),
		metric.WithDescription("Entries queued in the instance and not yet answered."))
	queuedBytes, err3 := m.Int64ObservableGauge(MetricQueuedBytes,
		metric.WithUnit("By"),
		metric.WithDescription("Encoded bytes of the entries queued in the instance."))
	inflight, err4 := m.Int64ObservableGauge(MetricInflight,
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests in flight in the instance."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(AttrInstance.String(instance)))
	return m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		g := gauges()
		obs.ObserveInt64(batchers, int64(g.Batchers), attrs)
		obs.ObserveInt64(queued, int64(g.Queued), attrs)
		obs.ObserveInt64(queuedBytes, g.QueuedBytes, attrs)
		obs.ObserveInt64(inflight, int64(g.InFlight), attrs)
		return nil
	}, batchers, queued, queuedBytes, inflight)
}

// Sink returns the SinkRecorder for one codec kind, building its attribute
// sets on the first call for that kind and returning the same recorder after.
func (o *OTel) Sink(sink string) SinkRecorder {
	o.mu.Lock()
	defer o.mu.Unlock()
	if r, ok := o.sinks[sink]; ok {
		return r
	}
	r := newSinkRecorder(o, sink)
	o.sinks[sink] = r
	return r
}

// Close unregisters the gauges' callback, after which a collection neither
// calls the gauges func nor reports the gauges. SinkRecorders keep working:
// their instruments hold nothing to release. Close is safe to call more than
// once and always returns nil after the first call.
func (o *OTel) Close() error {
	if err := o.unregister(&o.limitReg); err != nil {
		return err
	}
	return o.unregister(&o.reg)
}

// unregister takes *reg under o.mu, so that one caller alone sees it, and
// unregisters it.
func (o *OTel) unregister(reg *metric.Registration) error {
	o.mu.Lock()
	r := *reg
	*reg = nil
	o.mu.Unlock()
	if r == nil {
		return nil
	}
	if err := r.Unregister(); err != nil {
		return fmt.Errorf("sinkbatch: telemetry: %w", err)
	}
	return nil
}

// sinkRecorder holds, for one sink kind, every option slice its calls pass.
// They are built once so that Flushed and Refused allocate nothing of their
// own: a variadic call through an interface would otherwise build a fresh
// option slice on the heap each time.
type sinkRecorder struct {
	o        *OTel
	instance string
	sink     string

	add       []metric.AddOption                   // instance, sink
	byTrigger [len(triggers)][]metric.RecordOption // instance, sink, trigger; indexed by Trigger
	byReason  [len(reasons)][]metric.AddOption     // instance, sink, reason; indexed by FullReason
	byOutcome [len(outcomes)][]metric.AddOption    // instance, sink, outcome; indexed by Outcome
	record    []metric.RecordOption                // instance, sink
}

func newSinkRecorder(o *OTel, sink string) *sinkRecorder {
	r := &sinkRecorder{o: o, instance: o.instance, sink: sink}
	base := metric.WithAttributeSet(attribute.NewSet(AttrInstance.String(o.instance), AttrSink.String(sink)))
	r.add = []metric.AddOption{base}
	r.record = []metric.RecordOption{base}
	for _, t := range triggers {
		r.byTrigger[t] = []metric.RecordOption{r.triggerOption(t)}
	}
	for _, reason := range reasons {
		r.byReason[reason] = []metric.AddOption{r.reasonOption(reason)}
	}
	for _, o := range outcomes {
		r.byOutcome[o] = []metric.AddOption{r.outcomeOption(o)}
	}
	return r
}

func (r *sinkRecorder) outcomeOption(o Outcome) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		AttrInstance.String(r.instance), AttrSink.String(r.sink), AttrOutcome.String(o.String())))
}

// Answered counts one answered delivery.
func (r *sinkRecorder) Answered(o Outcome) {
	var add []metric.AddOption
	if i := int(o); i >= 0 && i < len(r.byOutcome) {
		add = r.byOutcome[i]
	} else {
		add = []metric.AddOption{r.outcomeOption(o)}
	}
	r.o.deliveries.Add(context.Background(), 1, add...)
}

// Waited records one delivery's wait in the queue.
func (r *sinkRecorder) Waited(d time.Duration) {
	r.o.wait.Record(context.Background(), d.Seconds(), r.record...)
}

func (r *sinkRecorder) triggerOption(t Trigger) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		AttrInstance.String(r.instance), AttrSink.String(r.sink), AttrTrigger.String(t.String())))
}

func (r *sinkRecorder) reasonOption(reason messages.FullReason) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		AttrInstance.String(r.instance), AttrSink.String(r.sink), AttrReason.String(reason.String())))
}

// Flushed records one batch on the flush instruments.
func (r *sinkRecorder) Flushed(f Flush) {
	// The SDK ignores the context unless a trace-based exemplar filter
	// samples it; batches span many callers' contexts, so none is theirs.
	ctx := context.Background()
	var rec []metric.RecordOption
	if t := int(f.Trigger); t >= 0 && t < len(r.byTrigger) {
		rec = r.byTrigger[t]
	} else {
		rec = []metric.RecordOption{r.triggerOption(f.Trigger)}
	}
	r.o.entries.Record(ctx, int64(f.Entries), rec...)
	r.o.bytes.Record(ctx, int64(f.Bytes), rec...)
	r.o.duration.Record(ctx, f.Duration.Seconds(), rec...)
	// Adding 0 still keeps the series alive, so a rate over it reads 0
	// rather than nothing.
	r.o.requests.Add(ctx, int64(f.Requests), r.add...)
	r.o.bisections.Add(ctx, int64(f.Bisections), r.add...)
}

// Refused records one refused delivery.
func (r *sinkRecorder) Refused(reason messages.FullReason) {
	var add []metric.AddOption
	if i := int(reason); i >= 0 && i < len(r.byReason) {
		add = r.byReason[i]
	} else {
		add = []metric.AddOption{r.reasonOption(reason)}
	}
	r.o.refused.Add(context.Background(), 1, add...)
}

var (
	_ Recorder         = (*OTel)(nil)
	_ SinkRecorder     = (*sinkRecorder)(nil)
	_ DeliveryRecorder = (*sinkRecorder)(nil)
)
