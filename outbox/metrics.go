package outbox

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the relay's metrics.
const ScopeName = "github.com/ankusa/sinkbatch/outbox"

type metrics struct {
	attrs                        metric.MeasurementOption
	claimed, sent, retried, dead metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider, r *Relay) (*metrics, error) {
	mt := mp.Meter(ScopeName)
	m := &metrics{attrs: metric.WithAttributes(attribute.String("table", r.cfg.Table))}
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = mt.Int64Counter(name, metric.WithUnit("{row}"), metric.WithDescription(desc))
		return c
	}
	m.claimed = counter("ankusa.sink_batch.outbox.claimed", "Rows claimed by the relay.")
	m.sent = counter("ankusa.sink_batch.outbox.sent", "Rows whose message the destination accepted.")
	m.retried = counter("ankusa.sink_batch.outbox.retried", "Rows put back to be claimed again.")
	m.dead = counter("ankusa.sink_batch.outbox.dead", "Rows refused for good.")
	if err != nil {
		return nil, fmt.Errorf("sinkbatch/outbox: metrics: %w", err)
	}
	inflight, err := mt.Int64ObservableGauge("ankusa.sink_batch.outbox.inflight", metric.WithUnit("{row}"),
		metric.WithDescription("Rows the relay is delivering."))
	if err != nil {
		return nil, fmt.Errorf("sinkbatch/outbox: metrics: %w", err)
	}
	oldest, err := mt.Float64ObservableGauge("ankusa.sink_batch.outbox.oldest_unsent.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the table's oldest unsent row; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("sinkbatch/outbox: metrics: %w", err)
	}
	// The age is read from the table when the metrics are collected: one
	// index probe per collection.
	_, err = mt.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(inflight, r.inflight.Load(), m.attrs)
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		age, err := r.OldestUnsent(qctx)
		if err != nil {
			return err
		}
		o.ObserveFloat64(oldest, age.Seconds(), m.attrs)
		return nil
	}, inflight, oldest)
	if err != nil {
		return nil, fmt.Errorf("sinkbatch/outbox: metrics: %w", err)
	}
	return m, nil
}
