package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MetricInflightLimit is the gauge of each adaptive destination's current
// in-flight limit (Tuning.Adaptive), with the attributes instance, sink and
// destination.
const MetricInflightLimit = "ankusa.sink_batch.inflight.limit"

// AttrDestination is the destination's name: the codec kind and a keyed
// digest of its identity, as in the batcher's logs. It holds no secret.
const AttrDestination = attribute.Key("destination")

// LimitRecorder is implemented by a SinkRecorder that reports adaptive
// in-flight limits. A batcher whose Tuning.Adaptive is set calls it when it
// starts, whenever the limit changes, and with limit 0 when it stops, after
// which the destination's series is no longer reported. It must be quick
// and safe for concurrent use, as the SinkRecorder's other methods.
type LimitRecorder interface {
	InflightLimit(destination string, limit int)
}

// limitKey is one destination of one sink kind.
type limitKey struct{ sink, destination string }

// registerLimit creates the in-flight limit gauge and its callback, which
// reports the limits the sink recorders were given.
func (o *OTel) registerLimit(m metric.Meter) (metric.Registration, error) {
	g, err := m.Int64ObservableGauge(MetricInflightLimit,
		metric.WithUnit("{request}"),
		metric.WithDescription("The adaptive in-flight limit of each destination with Tuning.Adaptive."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		for k, v := range o.limits {
			obs.ObserveInt64(g, int64(v), metric.WithAttributeSet(attribute.NewSet(
				AttrInstance.String(o.instance), AttrSink.String(k.sink), AttrDestination.String(k.destination))))
		}
		return nil
	}, g)
}

// InflightLimit records destination's adaptive in-flight limit; 0 forgets
// the destination.
func (r *sinkRecorder) InflightLimit(destination string, limit int) {
	o := r.o
	o.mu.Lock()
	defer o.mu.Unlock()
	k := limitKey{r.sink, destination}
	if limit <= 0 {
		delete(o.limits, k)
		return
	}
	if o.limits == nil {
		o.limits = make(map[limitKey]int)
	}
	o.limits[k] = limit
}

var _ LimitRecorder = (*sinkRecorder)(nil)
