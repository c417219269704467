//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// benchCodec is a destination with a round trip of latency, that keeps
// nothing.
func benchCodec(name string, latency time.Duration) *fakecodec.Codec {
	c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Latency, c.Discard = latency, true
	return c
}

const benchCallers = 300 // in all: split evenly over the members

// drive makes n deliveries from callers goroutines, each deliver(i) for
// the caller's index, and returns how long they took.
func drive(b *testing.B, n, callers int, deliver func(caller int) error) time.Duration {
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := deliver(c); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return d
}

// benchRounds is how many times BenchmarkClusterVsLocal alternates its
// three ways: on a shared machine the load drifts, and each way then meets
// the same drift.
const benchRounds = 5

// BenchmarkClusterVsLocal delivers b.N messages to one destination, from
// 300 callers, three ways in the same run:
//
//	local        one instance
//	cluster      three members, 100 callers each, through package clustered
//	unclustered  three instances, 100 callers each, each batching its own
//
// The three take turns, a fifth of b.N each per round. It reports
// deliveries/s of each, cluster/local (the cost of the wire hops), and
// entries per request of each (clustered batches fill from all members;
// unclustered ones a third as fast). With an instant destination the
// instance is the bottleneck and cluster/local is the wire's cost; with a
// 2 ms one the destination's in-flight limit bounds all but unclustered.
func BenchmarkClusterVsLocal(b *testing.B) {
	for _, latency := range []time.Duration{0, 2 * time.Millisecond} {
		b.Run(fmt.Sprintf("latency=%v", latency), func(b *testing.B) { benchClusterVsLocal(b, latency) })
	}
}

func benchClusterVsLocal(b *testing.B, latency time.Duration) {
	ctx := context.Background()
	msg := codec.Message{Body: []byte("benchmark body of a typical small event payload")}
	timed := func(deliver func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return deliver(ctx)
	}
	b.StopTimer()

	// local
	_, inst := testinst.Start(b, actors.Config{})
	local := benchCodec("local", latency)

	// unclustered: three instances, one destination each
	var unclustered []*fakecodec.Codec
	var insts []*actors.Instance
	for i := range 3 {
		_, in := testinst.Start(b, actors.Config{})
		insts = append(insts, in)
		unclustered = append(unclustered, benchCodec(fmt.Sprintf("u%d", i), latency))
	}

	// cluster
	ms := startTestCluster(b, 3, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec { return benchCodec(name, latency) }})
	// Warm the route from every member before timing.
	for _, m := range ms {
		_, err := m.node.Deliver(ctx, "dest", msg)
		require.NoError(b, err)
	}
	var before int64
	for _, m := range ms {
		before += m.fake("dest").Requests()
	}

	var dLocal, dUnclustered, dCluster time.Duration
	for r := range benchRounds {
		n := b.N / benchRounds
		if r == benchRounds-1 {
			n = b.N - (benchRounds-1)*n
		}
		b.StartTimer()
		dLocal += drive(b, n, benchCallers, func(int) error {
			return timed(func(ctx context.Context) error {
				_, err := inst.Deliver(ctx, local, msg)
				return err
			})
		})
		dCluster += drive(b, n, benchCallers, func(c int) error {
			return timed(func(ctx context.Context) error {
				_, err := ms[c%3].node.Deliver(ctx, "dest", msg)
				return err
			})
		})
		b.StopTimer()
		dUnclustered += drive(b, n, benchCallers, func(c int) error {
			return timed(func(ctx context.Context) error {
				_, err := insts[c%3].Deliver(ctx, unclustered[c%3], msg)
				return err
			})
		})
	}

	var clusterReqs, unclusteredReqs int64
	for _, m := range ms {
		clusterReqs += m.fake("dest").Requests()
	}
	clusterReqs -= before
	for _, c := range unclustered {
		unclusteredReqs += c.Requests()
	}
	rate := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(rate(dLocal), "local-deliveries/s")
	b.ReportMetric(rate(dCluster), "cluster-deliveries/s")
	b.ReportMetric(rate(dUnclustered), "unclustered-deliveries/s")
	b.ReportMetric(rate(dCluster)/rate(dLocal), "cluster/local")
	b.ReportMetric(float64(b.N)/float64(local.Requests()), "local-entries/req")
	b.ReportMetric(float64(b.N)/float64(clusterReqs), "cluster-entries/req")
	b.ReportMetric(float64(b.N)/float64(unclusteredReqs), "unclustered-entries/req")
}

// BenchmarkClusterOnly is the cluster way of BenchmarkClusterVsLocal alone
// (3 members, 100 callers each, an instant destination), for the bytes and
// allocations one delivery costs the whole process: all three members and
// the benchmark's own per-call ctx.
func BenchmarkClusterOnly(b *testing.B) {
	ctx := context.Background()
	msg := codec.Message{Body: []byte("benchmark body of a typical small event payload")}
	ms := startTestCluster(b, 3, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec { return benchCodec(name, 0) }})
	for _, m := range ms {
		_, err := m.node.Deliver(ctx, "dest", msg)
		require.NoError(b, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	d := drive(b, b.N, benchCallers, func(c int) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := ms[c%3].node.Deliver(ctx, "dest", msg)
		return err
	})
	b.ReportMetric(float64(b.N)/d.Seconds(), "deliveries/s")
}
