package actors_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// TestCredentialsNeverLeak sends through real SQS codecs (on kumo) whose
// static credentials carry a marker, makes some deliveries fail and the
// queue refuse, and then looks for the marker in every log line (at DEBUG,
// the instance's and the actor system's), every registered actor name, every
// metric attribute and every error text a caller saw.
func TestCredentialsNeverLeak(t *testing.T) {
	const secret = "wJalrXUtnFEMI-K7MDENG-MARKER-SECRET"
	const keyID = "AKIA-MARKER-KEYID"

	srv := kumo.NewServer()
	defer srv.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	awsCfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(keyID, secret, ""),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   &http.Client{Transport: tr},
	}
	admin := awssqs.NewFromConfig(awsCfg)
	out, err := admin.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String("leak-test")})
	require.NoError(t, err)

	logs := &testinst.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	inst, err := actors.Start(system, actors.Config{Name: "leak", Logger: logger, MeterProvider: mp})
	require.NoError(t, err)

	good, err := sqs.New(sqs.Config{QueueURL: aws.ToString(out.QueueUrl), AWS: awsCfg,
		Tuning: codec.Tuning{QueueMax: 5, MaxInflight: 1, Linger: 20 * time.Millisecond, IdleTimeout: 50 * time.Millisecond}})
	require.NoError(t, err)
	missing, err := sqs.New(sqs.Config{QueueURL: srv.URL + "/000000000000/no-such-queue", AWS: awsCfg})
	require.NoError(t, err)

	var errs []string
	var chans []<-chan result
	for i := range 40 { // more than QueueMax: some are refused
		chans = append(chans, deliverAsync(inst, good, codec.Message{Tenant: "t", Body: []byte(fmt.Sprint(i))}, 5*time.Second))
	}
	chans = append(chans,
		deliverAsync(inst, good, codec.Message{Tenant: "t", Body: nil}, 5*time.Second),            // invalid
		deliverAsync(inst, missing, codec.Message{Tenant: "t", Body: []byte("x")}, 5*time.Second), // QueueDoesNotExist
		deliverAsync(inst, good, codec.Message{Tenant: "t", Body: []byte(strings.Repeat("x", 1<<20+1))}, 5*time.Second))
	acked := 0
	for _, ch := range chans {
		r := await(t, ch)
		if r.err != nil {
			errs = append(errs, r.err.Error())
		} else {
			acked++
		}
	}
	assert.Greater(t, acked, 0)
	assert.GreaterOrEqual(t, len(errs), 3)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "stopped idle") }, 5*time.Second, 10*time.Millisecond)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var attrs []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			attrs = append(attrs, m.Name)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					attrs = append(attrs, p.Attributes.Encoded(attribute.DefaultEncoder()))
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					attrs = append(attrs, p.Attributes.Encoded(attribute.DefaultEncoder()))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					attrs = append(attrs, p.Attributes.Encoded(attribute.DefaultEncoder()))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					attrs = append(attrs, p.Attributes.Encoded(attribute.DefaultEncoder()))
				}
			}
		}
	}
	var names []string
	for _, shard := range system.ProcessRegistry.LocalPIDs.LocalPIDs {
		names = append(names, shard.Keys()...)
	}
	require.NoError(t, inst.Stop(context.Background()))

	for what, text := range map[string]string{
		"logs":        logs.String(),
		"actor names": strings.Join(names, "\n"),
		"metrics":     strings.Join(attrs, "\n"),
		"errors":      strings.Join(errs, "\n"),
	} {
		assert.NotContains(t, text, secret, what)
		assert.NotContains(t, text, keyID, what)
		assert.NotEmpty(t, text, what)
	}
	assert.Contains(t, strings.Join(attrs, "\n"), "sink=sqs", "the metrics were read")
	assert.Contains(t, strings.Join(attrs, "\n"), "reason=", "a refusal was recorded")
	assert.Contains(t, strings.Join(names, "\n"), "sinkbatch-leak/sqs-", "the batcher's name was read")
}

// TestGaugesMayBeCollectedDuringStart collects metrics while instances start
// and stop: the gauge callback is registered before Start returns.
func TestGaugesMayBeCollectedDuringStart(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	done := make(chan struct{})
	var collected atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			var rm metricdata.ResourceMetrics
			if reader.Collect(context.Background(), &rm) == nil {
				collected.Add(1)
			}
		}
	}()
	// At least 20 instances, and on until the collector has run a few
	// times alongside them (a loaded machine may not schedule it at once).
	for i := 0; i < 20 || (collected.Load() < 5 && i < 5000); i++ {
		inst, err := actors.Start(system, actors.Config{Name: fmt.Sprint("gauges", i), MeterProvider: mp})
		require.NoError(t, err)
		require.NoError(t, inst.Stop(context.Background()))
	}
	close(done)
	wg.Wait()
	assert.GreaterOrEqual(t, collected.Load(), int64(5))
}
