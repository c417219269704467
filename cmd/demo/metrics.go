package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/telemetry"
)

// metrics is the demo's OpenTelemetry SDK: a ManualReader the final table
// reads, and, with -metrics-addr, the Prometheus exporter behind /metrics.
// Nothing here touches the global MeterProvider or Prometheus registry.
type metrics struct {
	provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
	addr     string
	registry *prometheus.Registry // the exporter's; never the global one
	server   *http.Server
	served   chan struct{} // closed when the server's Serve returns
}

// newMetrics builds the MeterProvider, with the Prometheus exporter when
// addr is set. Nothing listens until serve.
func newMetrics(addr string) (*metrics, error) {
	m := &metrics{reader: sdkmetric.NewManualReader(), addr: addr}
	opts := []sdkmetric.Option{sdkmetric.WithReader(m.reader)}
	if addr != "" {
		m.registry = prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(m.registry))
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(exporter))
	}
	m.provider = sdkmetric.NewMeterProvider(opts...)
	return m, nil
}

// serve serves /metrics on the address given to newMetrics, if any, and
// prints the URL on w. Call it once the instance has started: a scrape
// that runs while actors.Start registers its gauges is a data race there.
func (m *metrics) serve(w io.Writer) error {
	if m.addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", m.addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	m.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	m.served = make(chan struct{})
	go func() {
		defer close(m.served)
		_ = m.server.Serve(lis)
	}()
	fmt.Fprintf(w, "metrics: serving http://%s/metrics\n", lis.Addr())
	return nil
}

// close stops the server and the provider.
func (m *metrics) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if m.server != nil {
		_ = m.server.Shutdown(ctx)
		<-m.served
	}
	_ = m.provider.Shutdown(ctx)
}

// sinkStats is what the SDK holds for one destination (its "sink"
// attribute is the destination's codec Name).
type sinkStats struct {
	batches    int64 // flush.entries count: batches sent
	entries    int64 // flush.entries sum: entries in them
	requests   int64 // flush.requests: requests, bisections included
	bisections int64 // flush.bisections
	refused    int64 // refused, every reason
}

// limits reads the adaptive in-flight limit gauge, by sink.
func (m *metrics) limits(ctx context.Context) (map[string]int64, error) {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != telemetry.MetricInflightLimit {
				continue
			}
			g, ok := mt.Data.(metricdata.Gauge[int64])
			if !ok {
				return nil, errors.New("metrics: inflight.limit is not an int64 gauge")
			}
			for _, dp := range g.DataPoints {
				sink, _ := dp.Attributes.Value(telemetry.AttrSink)
				out[sink.AsString()] = dp.Value
			}
		}
	}
	return out, nil
}

// collect reads the instance's instruments from the ManualReader.
func (m *metrics) collect(ctx context.Context) (map[string]*sinkStats, error) {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	out := map[string]*sinkStats{}
	stats := func(sink string) *sinkStats {
		s := out[sink]
		if s == nil {
			s = &sinkStats{}
			out[sink] = s
		}
		return s
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != telemetry.ScopeName {
			continue
		}
		for _, mt := range sm.Metrics {
			switch mt.Name {
			case telemetry.MetricFlushEntries:
				h, ok := mt.Data.(metricdata.Histogram[int64])
				if !ok {
					return nil, errors.New("metrics: flush.entries is not an int64 histogram")
				}
				for _, dp := range h.DataPoints {
					sink, _ := dp.Attributes.Value(telemetry.AttrSink)
					s := stats(sink.AsString())
					s.batches += int64(dp.Count)
					s.entries += dp.Sum
				}
			case telemetry.MetricFlushRequests, telemetry.MetricFlushBisections, telemetry.MetricRefused:
				sum, ok := mt.Data.(metricdata.Sum[int64])
				if !ok {
					return nil, fmt.Errorf("metrics: %s is not an int64 sum", mt.Name)
				}
				for _, dp := range sum.DataPoints {
					sink, _ := dp.Attributes.Value(telemetry.AttrSink)
					s := stats(sink.AsString())
					switch mt.Name {
					case telemetry.MetricFlushRequests:
						s.requests += dp.Value
					case telemetry.MetricFlushBisections:
						s.bisections += dp.Value
					default:
						s.refused += dp.Value
					}
				}
			}
		}
	}
	return out, nil
}
