//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"slices"
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
	return driveSplit(b, n, callers, 1, deliver)
}

// driveSplit is drive with the n deliveries split evenly over parts:
// caller c makes part c%parts's, so a part whose callers are slower takes
// longer instead of leaving its share to the others.
func driveSplit(b *testing.B, n, callers, parts int, deliver func(caller int) error) time.Duration {
	next := make([]atomic.Int64, parts*8) // a part's counter is next[part*8], a cache line from the next
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := c % parts
			quota := int64(n / parts)
			if part == parts-1 {
				quota = int64(n - (parts-1)*(n/parts))
			}
			for next[part*8].Add(1) <= quota {
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

// roundShare is round r's share of n deliveries: a benchRounds-th, and
// what is left over in the last round.
func roundShare(n, r int) int {
	share := n / benchRounds
	if r == benchRounds-1 {
		return n - (benchRounds-1)*share
	}
	return share
}

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

	owner, _ := ownerOf(b, ms, "dest")
	ownerIndex := slices.Index(ms, owner)
	// made[c*16]: deliveries caller c made through the cluster (a slot a
	// cache line apart from the next caller's).
	made := make([]int64, benchCallers*16)

	var dLocal, dUnclustered, dCluster time.Duration
	for r := range benchRounds {
		n := roundShare(b.N, r)
		b.StartTimer()
		dLocal += drive(b, n, benchCallers, func(int) error {
			return timed(func(ctx context.Context) error {
				_, err := inst.Deliver(ctx, local, msg)
				return err
			})
		})
		dCluster += drive(b, n, benchCallers, func(c int) error {
			made[c*16]++
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
	var byOwner int64
	for c := range benchCallers {
		if c%3 == ownerIndex {
			byOwner += made[c*16]
		}
	}
	rate := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(rate(dLocal), "local-deliveries/s")
	b.ReportMetric(rate(dCluster), "cluster-deliveries/s")
	b.ReportMetric(rate(dUnclustered), "unclustered-deliveries/s")
	b.ReportMetric(rate(dCluster)/rate(dLocal), "cluster/local")
	b.ReportMetric(float64(b.N)/float64(local.Requests()), "local-entries/req")
	b.ReportMetric(float64(b.N)/float64(clusterReqs), "cluster-entries/req")
	b.ReportMetric(float64(b.N)/float64(unclusteredReqs), "unclustered-entries/req")
	// The owner's callers admit directly, so they are faster and make more
	// than their third of the cluster's deliveries.
	b.ReportMetric(float64(byOwner)/float64(b.N), "cluster-owner-share")
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

// BenchmarkClusterCallersWhere is BenchmarkClusterVsLocal's instant
// destination with the 300 callers placed otherwise:
//
//	owner   all on the destination's owner (they admit directly)
//	others  all on the two other members (every delivery and answer
//	        crosses the wire)
//	even    100 on each member, each member's making a third of the
//	        deliveries (in BenchmarkClusterVsLocal the owner's faster
//	        callers make more than their third)
//
// Each alternates with one local instance in the same run, and reports
// cluster/local, and each way's CPU time per delivery (the whole process)
// and cores busy: when both ways keep every core busy, cluster/local is
// the ratio of their CPU costs, and only a cheaper path raises it.
func BenchmarkClusterCallersWhere(b *testing.B) {
	for _, where := range []string{"owner", "others", "even"} {
		b.Run(where, func(b *testing.B) { benchCallersWhere(b, where) })
	}
}

func benchCallersWhere(b *testing.B, where string) {
	ctx := context.Background()
	msg := codec.Message{Body: []byte("benchmark body of a typical small event payload")}
	deliver := func(d func(ctx context.Context) (string, error)) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := d(ctx)
		return err
	}
	b.StopTimer()
	_, inst := testinst.Start(b, actors.Config{})
	local := benchCodec("local", 0)
	ms := startTestCluster(b, 3, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec { return benchCodec(name, 0) }})
	owner, _ := ownerOf(b, ms, "dest")
	var callers []*member
	for _, m := range ms {
		if where == "even" || (m == owner) == (where == "owner") {
			callers = append(callers, m)
		}
		_, err := m.node.Deliver(ctx, "dest", msg)
		require.NoError(b, err)
	}

	var dLocal, dCluster, cLocal, cCluster time.Duration
	for r := range benchRounds {
		n := roundShare(b.N, r)
		b.StartTimer()
		c0 := cpuTime()
		dLocal += drive(b, n, benchCallers, func(int) error {
			return deliver(func(ctx context.Context) (string, error) { return inst.Deliver(ctx, local, msg) })
		})
		c1 := cpuTime()
		cLocal += c1 - c0
		parts := 1
		if where == "even" {
			parts = len(callers)
		}
		dCluster += driveSplit(b, n, benchCallers, parts, func(c int) error {
			return deliver(func(ctx context.Context) (string, error) {
				return callers[c%len(callers)].node.Deliver(ctx, "dest", msg)
			})
		})
		cCluster += cpuTime() - c1
		b.StopTimer()
	}
	rate := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(rate(dLocal), "local-deliveries/s")
	b.ReportMetric(rate(dCluster), "cluster-deliveries/s")
	b.ReportMetric(rate(dCluster)/rate(dLocal), "cluster/local")
	b.ReportMetric(float64(cLocal.Nanoseconds())/float64(b.N), "local-cpu-ns/op")
	b.ReportMetric(float64(cCluster.Nanoseconds())/float64(b.N), "cluster-cpu-ns/op")
	b.ReportMetric(cLocal.Seconds()/dLocal.Seconds(), "local-cores")
	b.ReportMetric(cCluster.Seconds()/dCluster.Seconds(), "cluster-cores")
}
