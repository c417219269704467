package telemetry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// newProvider returns an SDK MeterProvider read by a ManualReader, shut down
// when the test ends.
func newProvider(t testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { assert.NoError(t, mp.Shutdown(context.Background())) })
	return mp, reader
}

// collect reads every metric the reader holds, keyed by name.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := make(map[string]metricdata.Metrics)
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, telemetry.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// attrs returns the key the SDK's data points are compared by.
func attrs(kvs ...attribute.KeyValue) attribute.Distinct {
	set := attribute.NewSet(kvs...)
	return set.Equivalent()
}

func flushAttrs(instance, sink string, trigger telemetry.Trigger) attribute.Distinct {
	return attrs(telemetry.AttrInstance.String(instance), telemetry.AttrSink.String(sink),
		telemetry.AttrTrigger.String(trigger.String()))
}

func sinkAttrs(instance, sink string) attribute.Distinct {
	return attrs(telemetry.AttrInstance.String(instance), telemetry.AttrSink.String(sink))
}

func reasonAttrs(instance, sink string, reason messages.FullReason) attribute.Distinct {
	return attrs(telemetry.AttrInstance.String(instance), telemetry.AttrSink.String(sink),
		telemetry.AttrReason.String(reason.String()))
}

// histogram returns the metric's histogram points keyed by attribute set.
func histogram[N int64 | float64](t *testing.T, m metricdata.Metrics) map[attribute.Distinct]metricdata.HistogramDataPoint[N] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[N])
	require.Truef(t, ok, "%s: data is %T", m.Name, m.Data)
	assert.Equal(t, metricdata.CumulativeTemporality, h.Temporality)
	out := make(map[attribute.Distinct]metricdata.HistogramDataPoint[N])
	for _, dp := range h.DataPoints {
		out[dp.Attributes.Equivalent()] = dp
	}
	return out
}

// sum returns a monotonic counter's values keyed by attribute set.
func sum(t *testing.T, m metricdata.Metrics) map[attribute.Distinct]int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.Truef(t, ok, "%s: data is %T", m.Name, m.Data)
	assert.True(t, s.IsMonotonic, m.Name)
	out := make(map[attribute.Distinct]int64)
	for _, dp := range s.DataPoints {
		out[dp.Attributes.Equivalent()] = dp.Value
	}
	return out
}

// gauge returns a gauge's values keyed by attribute set.
func gauge(t *testing.T, m metricdata.Metrics) map[attribute.Distinct]int64 {
	t.Helper()
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.Truef(t, ok, "%s: data is %T", m.Name, m.Data)
	out := make(map[attribute.Distinct]int64)
	for _, dp := range g.DataPoints {
		out[dp.Attributes.Equivalent()] = dp.Value
	}
	return out
}

func TestNewNilProvider(t *testing.T) {
	o, err := telemetry.New(nil, "orders", nil)
	require.Error(t, err)
	assert.Nil(t, o)
	assert.Contains(t, err.Error(), "sinkbatch: telemetry:")
}

func TestInstrumentsUnitsAndKinds(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", func() telemetry.Gauges { return telemetry.Gauges{} })
	require.NoError(t, err)
	defer func() { assert.NoError(t, o.Close()) }()
	r := o.Sink("sqs")
	r.Flushed(telemetry.Flush{Trigger: telemetry.TriggerLinger, Entries: 1, Bytes: 1, Requests: 1, Duration: time.Millisecond})
	r.Refused(messages.FullEntries)
	d := r.(telemetry.DeliveryRecorder)
	d.Answered(telemetry.OutcomeOK)
	d.Waited(3 * time.Millisecond)

	got := collect(t, reader)
	for name, unit := range map[string]string{
		telemetry.MetricFlushEntries:    "{entry}",
		telemetry.MetricFlushBytes:      "By",
		telemetry.MetricFlushRequests:   "{request}",
		telemetry.MetricFlushBisections: "{request}",
		telemetry.MetricFlushDuration:   "s",
		telemetry.MetricRefused:         "{delivery}",
		telemetry.MetricBatchers:        "{batcher}",
		telemetry.MetricQueued:          "{entry}",
		telemetry.MetricQueuedBytes:     "By",
		telemetry.MetricDeliveries:      "{delivery}",
		telemetry.MetricQueueWait:       "s",
		telemetry.MetricInflight:        "{request}",
	} {
		m, ok := got[name]
		if assert.Truef(t, ok, "%s not reported", name) {
			assert.Equal(t, unit, m.Unit, name)
			assert.NotEmpty(t, m.Description, name)
		}
	}
	assert.Len(t, got, 12)

	// The instruments' kinds; histogram bounds are the documented ones.
	entries := histogram[int64](t, got[telemetry.MetricFlushEntries])
	assert.Equal(t, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		entries[flushAttrs("orders", "sqs", telemetry.TriggerLinger)].Bounds)
	bytes := histogram[int64](t, got[telemetry.MetricFlushBytes])
	assert.Equal(t, []float64{256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216},
		bytes[flushAttrs("orders", "sqs", telemetry.TriggerLinger)].Bounds)
	duration := histogram[float64](t, got[telemetry.MetricFlushDuration])
	assert.Equal(t, []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		duration[flushAttrs("orders", "sqs", telemetry.TriggerLinger)].Bounds)
	sum(t, got[telemetry.MetricFlushRequests])
	sum(t, got[telemetry.MetricFlushBisections])
	sum(t, got[telemetry.MetricRefused])
	gauge(t, got[telemetry.MetricBatchers])
	gauge(t, got[telemetry.MetricQueued])
	gauge(t, got[telemetry.MetricQueuedBytes])
	gauge(t, got[telemetry.MetricInflight])
	sum(t, got[telemetry.MetricDeliveries])
	wait := histogram[float64](t, got[telemetry.MetricQueueWait])
	waitSet := attribute.NewSet(telemetry.AttrInstance.String("orders"), telemetry.AttrSink.String("sqs"))
	assert.Equal(t, []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		wait[waitSet.Equivalent()].Bounds)
}

// Each outcome is counted under its own attribute set.
func TestAnsweredCountsByOutcome(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)
	d := o.Sink("sqs").(telemetry.DeliveryRecorder)
	want := map[telemetry.Outcome]int64{telemetry.OutcomeOK: 3, telemetry.OutcomeRefused: 1, telemetry.OutcomePermanent: 2,
		telemetry.OutcomeRetryable: 1, telemetry.OutcomeDeadline: 1, telemetry.OutcomeDown: 1, telemetry.OutcomeStopped: 4}
	for o, n := range want {
		for range n {
			d.Answered(o)
		}
	}
	got := sum(t, collect(t, reader)[telemetry.MetricDeliveries])
	for o, n := range want {
		set := attribute.NewSet(telemetry.AttrInstance.String("orders"), telemetry.AttrSink.String("sqs"), telemetry.AttrOutcome.String(o.String()))
		assert.Equal(t, n, got[set.Equivalent()], o.String())
	}
	assert.Len(t, got, len(want))
}

func TestFlushed(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)

	sqs, pubsub := o.Sink("sqs"), o.Sink("pubsub")
	sqs.Flushed(telemetry.Flush{Trigger: telemetry.TriggerEntries, Entries: 10, Bytes: 3000, Requests: 1, Duration: 20 * time.Millisecond})
	sqs.Flushed(telemetry.Flush{Trigger: telemetry.TriggerEntries, Entries: 10, Bytes: 900_000, Requests: 5, Bisections: 4, Duration: 300 * time.Millisecond})
	sqs.Flushed(telemetry.Flush{Trigger: telemetry.TriggerLinger, Entries: 3, Bytes: 200, Requests: 1, Duration: 2 * time.Millisecond})
	pubsub.Flushed(telemetry.Flush{Trigger: telemetry.TriggerBytes, Entries: 700, Bytes: 9 << 20, Requests: 1, Duration: 1500 * time.Millisecond})
	pubsub.Flushed(telemetry.Flush{Trigger: telemetry.TriggerDrain, Entries: 1, Bytes: 100, Requests: 1, Duration: 500 * time.Microsecond})

	got := collect(t, reader)
	sqsEntries := flushAttrs("orders", "sqs", telemetry.TriggerEntries)
	sqsLinger := flushAttrs("orders", "sqs", telemetry.TriggerLinger)
	psBytes := flushAttrs("orders", "pubsub", telemetry.TriggerBytes)
	psDrain := flushAttrs("orders", "pubsub", telemetry.TriggerDrain)

	t.Run("entries", func(t *testing.T) {
		h := histogram[int64](t, got[telemetry.MetricFlushEntries])
		require.Len(t, h, 4)
		assert.Equal(t, uint64(2), h[sqsEntries].Count)
		assert.Equal(t, int64(20), h[sqsEntries].Sum)
		// Two batches of 10 land in the (5, 10] bucket.
		assert.Equal(t, []uint64{0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}, h[sqsEntries].BucketCounts)
		assert.Equal(t, uint64(1), h[sqsLinger].Count)
		assert.Equal(t, int64(3), h[sqsLinger].Sum)
		assert.Equal(t, int64(700), h[psBytes].Sum)
		assert.Equal(t, uint64(1), h[psBytes].BucketCounts[9]) // (500, 1000]
		assert.Equal(t, int64(1), h[psDrain].Sum)
		assert.Equal(t, uint64(1), h[psDrain].BucketCounts[0]) // ≤ 1
	})
	t.Run("bytes", func(t *testing.T) {
		h := histogram[int64](t, got[telemetry.MetricFlushBytes])
		require.Len(t, h, 4)
		assert.Equal(t, uint64(2), h[sqsEntries].Count)
		assert.Equal(t, int64(903_000), h[sqsEntries].Sum)
		// 3000 in (1 KiB, 4 KiB]; 900 000 in (256 KiB, 1 MiB].
		assert.Equal(t, []uint64{0, 0, 1, 0, 0, 0, 1, 0, 0, 0}, h[sqsEntries].BucketCounts)
		assert.Equal(t, int64(200), h[sqsLinger].Sum)
		assert.Equal(t, int64(9<<20), h[psBytes].Sum)
		assert.Equal(t, uint64(1), h[psBytes].BucketCounts[8]) // (4 MiB, 16 MiB]
		assert.Equal(t, int64(100), h[psDrain].Sum)
	})
	t.Run("duration", func(t *testing.T) {
		h := histogram[float64](t, got[telemetry.MetricFlushDuration])
		require.Len(t, h, 4)
		assert.Equal(t, uint64(2), h[sqsEntries].Count)
		assert.InDelta(t, 0.32, h[sqsEntries].Sum, 1e-9)
		assert.InDelta(t, 0.002, h[sqsLinger].Sum, 1e-9)
		assert.InDelta(t, 1.5, h[psBytes].Sum, 1e-9)
		assert.InDelta(t, 0.0005, h[psDrain].Sum, 1e-9)
		assert.Equal(t, uint64(1), h[psDrain].BucketCounts[0]) // ≤ 1 ms
	})
	t.Run("requests", func(t *testing.T) {
		s := sum(t, got[telemetry.MetricFlushRequests])
		assert.Equal(t, map[attribute.Distinct]int64{
			sinkAttrs("orders", "sqs"):    7,
			sinkAttrs("orders", "pubsub"): 2,
		}, s)
	})
	t.Run("bisections", func(t *testing.T) {
		s := sum(t, got[telemetry.MetricFlushBisections])
		// pubsub never bisected, but its series exists and reads 0.
		assert.Equal(t, map[attribute.Distinct]int64{
			sinkAttrs("orders", "sqs"):    4,
			sinkAttrs("orders", "pubsub"): 0,
		}, s)
	})
}

func TestRefused(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)

	sqs, pubsub := o.Sink("sqs"), o.Sink("pubsub")
	for range 3 {
		sqs.Refused(messages.FullEntries)
	}
	sqs.Refused(messages.FullTenant)
	pubsub.Refused(messages.FullBytes)
	pubsub.Refused(messages.FullBytes)

	got := collect(t, reader)
	assert.Equal(t, map[attribute.Distinct]int64{
		reasonAttrs("orders", "sqs", messages.FullEntries):  3,
		reasonAttrs("orders", "sqs", messages.FullTenant):   1,
		reasonAttrs("orders", "pubsub", messages.FullBytes): 2,
	}, sum(t, got[telemetry.MetricRefused]))
	_, flushed := got[telemetry.MetricFlushEntries]
	assert.False(t, flushed, "a refusal reports no flush")
}

// Values outside the known ranges are a bug in the caller, but they still
// count, under their String() form, rather than vanish or panic.
func TestUnknownTriggerAndReason(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)
	r := o.Sink("sqs")
	r.Flushed(telemetry.Flush{Trigger: telemetry.Trigger(9), Entries: 4, Bytes: 40, Requests: 1})
	r.Refused(messages.FullReason(-1))

	got := collect(t, reader)
	h := histogram[int64](t, got[telemetry.MetricFlushEntries])
	assert.Equal(t, int64(4), h[flushAttrs("orders", "sqs", telemetry.Trigger(9))].Sum)
	assert.Equal(t, map[attribute.Distinct]int64{
		reasonAttrs("orders", "sqs", messages.FullReason(-1)): 1,
	}, sum(t, got[telemetry.MetricRefused]))
}

func TestGaugesFollowTheCallback(t *testing.T) {
	mp, reader := newProvider(t)
	var cur atomic.Pointer[telemetry.Gauges]
	cur.Store(&telemetry.Gauges{Batchers: 2, Queued: 15, QueuedBytes: 4096})
	o, err := telemetry.New(mp, "orders", func() telemetry.Gauges { return *cur.Load() })
	require.NoError(t, err)
	defer func() { assert.NoError(t, o.Close()) }()

	// The gauges carry the instance only: Gauges has no per-sink breakdown.
	inst := attrs(telemetry.AttrInstance.String("orders"))
	check := func(batchers, queued, queuedBytes int64) {
		t.Helper()
		got := collect(t, reader)
		assert.Equal(t, map[attribute.Distinct]int64{inst: batchers}, gauge(t, got[telemetry.MetricBatchers]))
		assert.Equal(t, map[attribute.Distinct]int64{inst: queued}, gauge(t, got[telemetry.MetricQueued]))
		assert.Equal(t, map[attribute.Distinct]int64{inst: queuedBytes}, gauge(t, got[telemetry.MetricQueuedBytes]))
	}
	check(2, 15, 4096)
	cur.Store(&telemetry.Gauges{Batchers: 1, Queued: 0, QueuedBytes: 0})
	check(1, 0, 0)
	cur.Store(&telemetry.Gauges{Batchers: 40, Queued: 12_000, QueuedBytes: 3 << 30})
	check(40, 12_000, 3<<30)
}

// Two instances on one provider report their gauges side by side, and
// closing one leaves the other's.
func TestGaugesPerInstance(t *testing.T) {
	mp, reader := newProvider(t)
	a, err := telemetry.New(mp, "a", func() telemetry.Gauges { return telemetry.Gauges{Batchers: 1} })
	require.NoError(t, err)
	b, err := telemetry.New(mp, "b", func() telemetry.Gauges { return telemetry.Gauges{Batchers: 2} })
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()

	ia := attrs(telemetry.AttrInstance.String("a"))
	ib := attrs(telemetry.AttrInstance.String("b"))
	assert.Equal(t, map[attribute.Distinct]int64{ia: 1, ib: 2},
		gauge(t, collect(t, reader)[telemetry.MetricBatchers]))

	require.NoError(t, a.Close())
	assert.Equal(t, map[attribute.Distinct]int64{ib: 2},
		gauge(t, collect(t, reader)[telemetry.MetricBatchers]))
}

func TestCloseStopsTheCallback(t *testing.T) {
	mp, reader := newProvider(t)
	var calls atomic.Int64
	o, err := telemetry.New(mp, "orders", func() telemetry.Gauges {
		calls.Add(1)
		return telemetry.Gauges{Batchers: 3, Queued: 7, QueuedBytes: 70}
	})
	require.NoError(t, err)
	r := o.Sink("sqs")

	got := collect(t, reader)
	require.Equal(t, int64(1), calls.Load())
	require.Len(t, gauge(t, got[telemetry.MetricQueued]), 1)

	require.NoError(t, o.Close())
	require.NoError(t, o.Close(), "Close is idempotent")

	// The SinkRecorder keeps working after Close.
	r.Refused(messages.FullBytes)
	got = collect(t, reader)
	assert.Equal(t, int64(1), calls.Load(), "the gauges func was called after Close")
	for _, name := range []string{telemetry.MetricBatchers, telemetry.MetricQueued, telemetry.MetricQueuedBytes} {
		if m, ok := got[name]; ok {
			assert.Emptyf(t, gauge(t, m), "%s reported after Close", name)
		}
	}
	assert.Equal(t, map[attribute.Distinct]int64{
		reasonAttrs("orders", "sqs", messages.FullBytes): 1,
	}, sum(t, got[telemetry.MetricRefused]))
}

func TestNilGaugesReportsNoGauges(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)
	require.NoError(t, o.Close())
	got := collect(t, reader)
	assert.NotContains(t, got, telemetry.MetricBatchers)
	assert.NotContains(t, got, telemetry.MetricQueued)
	assert.NotContains(t, got, telemetry.MetricQueuedBytes)
}

func TestSinkReusesRecorders(t *testing.T) {
	mp, _ := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)

	// Batchers start concurrently; they must all get the one recorder per sink.
	const n = 16
	got := make([]telemetry.SinkRecorder, 2*n)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			sink := "sqs"
			if i%2 == 1 {
				sink = "pubsub"
			}
			got[i] = o.Sink(sink)
		})
	}
	wg.Wait()
	for i := range got {
		assert.Same(t, got[i%2], got[i])
	}
	assert.NotSame(t, got[0], got[1])
	assert.Same(t, got[0], o.Sink("sqs"))
}

func TestNop(t *testing.T) {
	var rec telemetry.Recorder = telemetry.Nop{}
	var sr telemetry.SinkRecorder = telemetry.Nop{}
	assert.Equal(t, telemetry.Nop{}, rec.Sink("sqs"))
	assert.NotPanics(t, func() {
		sr.Flushed(telemetry.Flush{Trigger: telemetry.TriggerDrain, Entries: 1})
		sr.Refused(messages.FullTenant)
	})
}

func TestTriggerString(t *testing.T) {
	for tr, want := range map[telemetry.Trigger]string{
		telemetry.TriggerEntries: "entries",
		telemetry.TriggerBytes:   "bytes",
		telemetry.TriggerLinger:  "linger",
		telemetry.TriggerDrain:   "drain",
		telemetry.Trigger(7):     "Trigger(7)",
	} {
		assert.Equal(t, want, tr.String())
	}
}

// failingMeter is a Meter whose instruments all fail to be created, as an SDK
// reports an invalid instrument name.
type failingMeter struct{ noop.Meter }

var errInstrument = errors.New("instrument refused")

func (failingMeter) Int64Histogram(string, ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	return noop.Int64Histogram{}, errInstrument
}

type failingProvider struct{ noop.MeterProvider }

func (failingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return failingMeter{} }

func TestNewReportsInstrumentErrors(t *testing.T) {
	o, err := telemetry.New(failingProvider{}, "orders", func() telemetry.Gauges { return telemetry.Gauges{} })
	require.ErrorIs(t, err, errInstrument)
	assert.Nil(t, o)
}

// InflightLimit reports one series per destination, with instance, sink and
// destination; limit 0 removes it, and Close stops the gauge.
func TestInflightLimit(t *testing.T) {
	mp, reader := newProvider(t)
	o, err := telemetry.New(mp, "orders", nil)
	require.NoError(t, err)
	lr, ok := o.Sink("sqs").(telemetry.LimitRecorder)
	require.True(t, ok, "the sink recorder reports limits")
	lr.InflightLimit("sqs-aaa", 3)
	lr.InflightLimit("sqs-bbb", 7)
	lr.InflightLimit("sqs-aaa", 4)
	dest := func(d string) attribute.Distinct {
		return attrs(telemetry.AttrInstance.String("orders"), telemetry.AttrSink.String("sqs"), telemetry.AttrDestination.String(d))
	}
	got := gauge(t, collect(t, reader)[telemetry.MetricInflightLimit])
	assert.Equal(t, map[attribute.Distinct]int64{dest("sqs-aaa"): 4, dest("sqs-bbb"): 7}, got)
	lr.InflightLimit("sqs-aaa", 0)
	got = gauge(t, collect(t, reader)[telemetry.MetricInflightLimit])
	assert.Equal(t, map[attribute.Distinct]int64{dest("sqs-bbb"): 7}, got)
	require.NoError(t, o.Close())
	_, present := collect(t, reader)[telemetry.MetricInflightLimit]
	assert.False(t, present, "no limit after Close")
}
