package pubsub_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ankusa/sinkbatch/codec"
)

// Benchmark parameters shared by sinkbatch and the baseline.
const (
	benchBody     = 100 // bytes
	benchKeys     = 16  // ordering keys in the ordered variant; caller c uses key c % benchKeys
	benchMaxCount = 1000
	benchDelay    = 5 * time.Millisecond
)

// BenchmarkPublish compares, in one run on one pstest server, sinkbatch with
// this codec against the Pub/Sub client's own batching publisher
// (Publisher.Publish + Get) with the same thresholds (1000 messages, 5ms)
// and the same number of concurrent callers (256 and 2048), each waiting for its message's
// id before sending the next. Each iteration publishes one message through
// each. It reports msgs/s and CPU time (user+sys of the whole process, the
// in-process server included) per message for both, and their ratios
// (sinkbatch / google).
func BenchmarkPublish(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		for _, callers := range []int{256, 2048} {
			name := "unordered"
			if ordered {
				name = fmt.Sprintf("ordered-%dkeys", benchKeys)
			}
			b.Run(fmt.Sprintf("%s/callers=%d", name, callers), func(b *testing.B) { benchCompare(b, ordered, callers) })
		}
	}
}

// usage is the process's user+sys CPU time so far.
func usage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drive runs n sends across callers goroutines and returns the wall
// and CPU time they took. send returns the message id.
func drive(b *testing.B, n, callers int, send func(caller, i int) (string, error)) (wall, cpu time.Duration) {
	var (
		next   atomic.Int64
		failed atomic.Int64
		first  atomic.Value
		wg     sync.WaitGroup
	)
	cpu0, t0 := usage(b), time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if id, err := send(c, i); err != nil || id == "" {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprint(err))
				}
			}
		}()
	}
	wg.Wait()
	wall, cpu = time.Since(t0), usage(b)-cpu0
	require.Zero(b, failed.Load(), "first failure: %v", first.Load())
	return wall, cpu
}

func benchCompare(b *testing.B, ordered bool, callers int) {
	srv := newServer(b)
	ctx := context.Background()
	body := bytes.Repeat([]byte{'x'}, benchBody)
	key := func(caller int) string {
		if !ordered {
			return ""
		}
		return fmt.Sprint("key-", caller%benchKeys)
	}

	client, err := gpubsub.NewClient(ctx, "p",
		option.WithEndpoint(srv.Addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(b, err)
	defer func() { require.NoError(b, client.Close()) }()
	pub := client.Publisher(testTopic)
	pub.PublishSettings.CountThreshold = benchMaxCount
	pub.PublishSettings.DelayThreshold = benchDelay
	pub.PublishSettings.ByteThreshold = 9_000_000 // not the binding threshold, as for sinkbatch
	pub.EnableMessageOrdering = ordered
	defer pub.Stop()

	c := newCodec(b, srv.Addr, testTopic, codec.Tuning{MaxEntries: benchMaxCount, Linger: benchDelay})
	inst := startInstance(b)

	// Names made once, so that neither side pays for formatting them.
	tenants, keys := make([]string, callers), make([]string, callers)
	for i := range callers {
		tenants[i], keys[i] = fmt.Sprint("t", i%8), key(i)
	}
	google := func(n int) (time.Duration, time.Duration) {
		return drive(b, n, callers, func(caller, _ int) (string, error) {
			return pub.Publish(ctx, &gpubsub.Message{Data: body, OrderingKey: keys[caller]}).Get(ctx)
		})
	}
	sinkbatch := func(n int) (time.Duration, time.Duration) {
		return drive(b, n, callers, func(caller, _ int) (string, error) {
			return inst.Deliver(ctx, c, codec.Message{Tenant: tenants[caller], Group: keys[caller], Body: body})
		})
	}
	var gWall, gCPU, sWall, sCPU time.Duration
	add := func(wall, cpu *time.Duration) func(time.Duration, time.Duration) {
		return func(w, c time.Duration) { *wall += w; *cpu += c; srv.ClearMessages() }
	}
	// Halves in the order google, sinkbatch, sinkbatch, google, so that
	// neither always runs first or last.
	first, second := b.N/2, b.N-b.N/2
	b.ReportAllocs()
	b.ResetTimer()
	add(&gWall, &gCPU)(google(first))
	add(&sWall, &sCPU)(sinkbatch(first))
	add(&sWall, &sCPU)(sinkbatch(second))
	add(&gWall, &gCPU)(google(second))
	b.StopTimer()

	n := float64(b.N)
	gRate, sRate := n/gWall.Seconds(), n/sWall.Seconds()
	gCPUPer, sCPUPer := float64(gCPU.Microseconds())/n, float64(sCPU.Microseconds())/n
	b.ReportMetric(sRate, "sinkbatch-msgs/s")
	b.ReportMetric(gRate, "google-msgs/s")
	b.ReportMetric(sRate/gRate, "rate-ratio")
	b.ReportMetric(sCPUPer, "sinkbatch-cpu-µs/msg")
	b.ReportMetric(gCPUPer, "google-cpu-µs/msg")
	b.ReportMetric(sCPUPer/gCPUPer, "cpu-ratio")
}
