package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

var benchFlush = telemetry.Flush{
	Trigger: telemetry.TriggerEntries, Entries: 10, Bytes: 12_000,
	Requests: 2, Bisections: 1, Duration: 25 * time.Millisecond,
}

// sdkBaseline holds instruments made directly on an SDK meter, called with
// option slices built once: the least any caller can pay the SDK per
// measurement. The recorder's cost is judged against it.
type sdkBaseline struct {
	counter   metric.Int64Counter
	histogram metric.Int64Histogram
	float     metric.Float64Histogram
	add       []metric.AddOption
	record    []metric.RecordOption
}

func newSDKBaseline(t testing.TB) sdkBaseline {
	t.Helper()
	mp, _ := newProvider(t)
	m := mp.Meter("baseline")
	var b sdkBaseline
	var err error
	b.counter, err = m.Int64Counter("baseline.counter")
	require.NoError(t, err)
	b.histogram, err = m.Int64Histogram("baseline.histogram", metric.WithExplicitBucketBoundaries(1, 10, 100))
	require.NoError(t, err)
	b.float, err = m.Float64Histogram("baseline.float", metric.WithExplicitBucketBoundaries(0.01, 0.1, 1))
	require.NoError(t, err)
	opt := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("instance", "orders"), attribute.String("sink", "sqs"), attribute.String("trigger", "entries")))
	b.add = []metric.AddOption{opt}
	b.record = []metric.RecordOption{opt}
	return b
}

// flushEquivalent makes the same SDK calls as one Flushed: three histogram
// records and two counter adds.
func (b sdkBaseline) flushEquivalent() {
	ctx := context.Background()
	b.histogram.Record(ctx, 10, b.record...)
	b.histogram.Record(ctx, 12_000, b.record...)
	b.float.Record(ctx, 0.025, b.record...)
	b.counter.Add(ctx, 2, b.add...)
	b.counter.Add(ctx, 1, b.add...)
}

func newSink(t testing.TB) telemetry.SinkRecorder {
	t.Helper()
	mp, _ := newProvider(t)
	o, err := telemetry.New(mp, "orders", func() telemetry.Gauges { return telemetry.Gauges{} })
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, o.Close()) })
	return o.Sink("sqs")
}

// Flushed, Refused, Answered and Waited run for every batch, refusal and
// delivery, so they may cost
// no more allocations than the SDK itself charges for the same calls. (With
// SDK v1.47 and WithAttributeSet options built once, that is zero.)
func TestRecordingAllocatesNothingOfItsOwn(t *testing.T) {
	base := newSDKBaseline(t)
	r := newSink(t)
	// Warm up: the SDK allocates a series the first time it sees an
	// attribute set; that is per series, not per call.
	base.flushEquivalent()
	base.counter.Add(context.Background(), 1, base.add...)
	r.Flushed(benchFlush)
	r.Refused(messages.FullTenant)
	d := r.(telemetry.DeliveryRecorder)
	d.Answered(telemetry.OutcomeRetryable)
	d.Waited(time.Millisecond)

	const runs = 1000
	sdkAdd := testing.AllocsPerRun(runs, func() { base.counter.Add(context.Background(), 1, base.add...) })
	sdkFlush := testing.AllocsPerRun(runs, base.flushEquivalent)
	flushed := testing.AllocsPerRun(runs, func() { r.Flushed(benchFlush) })
	refused := testing.AllocsPerRun(runs, func() { r.Refused(messages.FullTenant) })
	answered := testing.AllocsPerRun(runs, func() { d.Answered(telemetry.OutcomeRetryable) })
	waited := testing.AllocsPerRun(runs, func() { d.Waited(time.Millisecond) })
	t.Logf("allocs per call: SDK Add %v, SDK flush-equivalent %v; Flushed %v, Refused %v, Answered %v, Waited %v", sdkAdd, sdkFlush, flushed, refused, answered, waited)

	assert.LessOrEqual(t, flushed, sdkFlush, "Flushed allocates beyond the SDK's own cost")
	assert.LessOrEqual(t, refused, sdkAdd, "Refused allocates beyond the SDK's own cost")
	assert.LessOrEqual(t, answered, sdkAdd, "Answered allocates beyond the SDK's own cost")
	assert.LessOrEqual(t, waited, sdkAdd, "Waited allocates beyond the SDK's own cost (one histogram Record)")
}

// BenchmarkRecorder measures Flushed and Refused beside the bare SDK calls
// they make, so the recorder's overhead reads as a ratio.
func BenchmarkRecorder(b *testing.B) {
	b.Run("sdk/Add", func(b *testing.B) {
		base := newSDKBaseline(b)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			base.counter.Add(ctx, 1, base.add...)
		}
	})
	// What precomputing saves: the option built on each call, as
	// metric.WithAttributes does.
	b.Run("sdk/AddWithAttributes", func(b *testing.B) {
		base := newSDKBaseline(b)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			base.counter.Add(ctx, 1, metric.WithAttributes(
				attribute.String("instance", "orders"), attribute.String("sink", "sqs"), attribute.String("trigger", "entries")))
		}
	})
	b.Run("sdk/Record", func(b *testing.B) {
		base := newSDKBaseline(b)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			base.histogram.Record(ctx, 10, base.record...)
		}
	})
	b.Run("sdk/flush-equivalent", func(b *testing.B) {
		base := newSDKBaseline(b)
		b.ReportAllocs()
		for b.Loop() {
			base.flushEquivalent()
		}
	})
	b.Run("Flushed", func(b *testing.B) {
		r := newSink(b)
		b.ReportAllocs()
		for b.Loop() {
			r.Flushed(benchFlush)
		}
	})
	b.Run("Refused", func(b *testing.B) {
		r := newSink(b)
		b.ReportAllocs()
		for b.Loop() {
			r.Refused(messages.FullTenant)
		}
	})
	b.Run("Flushed/parallel", func(b *testing.B) {
		r := newSink(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.Flushed(benchFlush)
			}
		})
	})
}
