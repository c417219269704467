package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/telemetry"
)

// The deliveries counter counts each answer by outcome, queue.wait has one
// sample per sent entry, and the inflight gauge reads Stats.
func TestDeliveryMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	_, inst := start(t, actors.Config{Name: "metrics", MeterProvider: mp})
	c, v := valved("q", codec.Limits{MaxEntries: 10, MaxBytes: 100}, codec.Tuning{Linger: time.Millisecond, MaxInflight: 1})
	var chans []<-chan result
	for range 5 {
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "ok"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	// Stats, which the gauge reads, are published by the batcher after it
	// launched the request, which may enter the codec first.
	assert.Eventually(t, func() bool { return collectGauge(t, reader, telemetry.MetricInflight) == 1 }, 5*time.Second, time.Millisecond, "one request in flight")
	v.Open()
	for _, ch := range chans {
		require.NoError(t, await(t, ch).err)
	}
	_, err := inst.Deliver(context.Background(), c, msg("a", "", string(make([]byte, 101))))
	require.ErrorIs(t, err, codec.ErrTooLarge)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	_, _ = inst.Deliver(ctx, c, msg("a", "", "late")) // answered by the front door: not counted

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	counts := map[string]int64{}
	var waits uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case telemetry.MetricDeliveries:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					o, _ := dp.Attributes.Value(telemetry.AttrOutcome)
					sink, _ := dp.Attributes.Value(telemetry.AttrSink)
					assert.Equal(t, "fake", sink.AsString())
					counts[o.AsString()] += dp.Value
				}
			case telemetry.MetricQueueWait:
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					waits += dp.Count
					assert.Greater(t, dp.Sum, 0.0)
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{"ok": 5, "permanent": 1}, counts)
	assert.Equal(t, uint64(5), waits, "one wait per sent entry")
}

// collectGauge reads an instance-wide gauge.
func collectGauge(t *testing.T, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				dps := m.Data.(metricdata.Gauge[int64]).DataPoints
				require.Len(t, dps, 1)
				inst, _ := dps[0].Attributes.Value(attribute.Key("instance"))
				assert.Equal(t, "metrics", inst.AsString())
				return dps[0].Value
			}
		}
	}
	t.Fatalf("%s not reported", name)
	return 0
}
