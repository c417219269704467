//go:build !race && unix

package clustered_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// BenchmarkClusterProcesses runs BenchmarkClusterCallersWhere's even split
// with each member in a process of its own (automanaged on loopback), and
// one local instance with 300 callers in another, to measure what each
// process spends: the CPU time of each member per delivery of the whole
// cluster, and the local instance's per delivery. In one process on one
// machine, cluster/local is the ratio of the two ways' total CPU: three
// members spend more than one instance. Replicas run on machines of their
// own, each with its cores: there the cluster's deliveries/s is bounded by
// its busiest member (the destination's owner), and
//
//	est-cluster/local = local CPU per delivery ÷ the busiest member's CPU per delivery of the cluster
//
// is the ratio of the two ways' deliveries/s when each process has the
// same cores and the CPU is the bottleneck (an instant destination). The
// processes share this machine's cores while they run; wall-cluster/local
// is their deliveries/s ratio here, as in BenchmarkClusterCallersWhere.
func BenchmarkClusterProcesses(b *testing.B) {
	if cpuTime() == 0 {
		b.Skip("no getrusage here")
	}
	c := newManaged(b, 3)
	owner := c.owner("dest", 0, 1, 2)
	var members []*child
	for i := range 3 {
		members = append(members, startChild(b, "member", i, c))
	}
	local := startChild(b, "local", 0, c)
	all := append(slices.Clone(members), local)
	for _, ch := range all {
		ch.expect(b, "ready")
	}

	var dLocal, dCluster time.Duration
	var cLocal time.Duration
	cMember := make([]time.Duration, 3)
	for r := range benchRounds {
		n := roundShare(b.N, r)
		b.StartTimer()
		before := local.cpu(b)
		start := time.Now()
		local.run(b, n)
		local.done(b)
		dLocal += time.Since(start)
		cLocal += local.cpu(b) - before

		var marks []time.Duration
		for _, m := range members {
			marks = append(marks, m.cpu(b))
		}
		start = time.Now()
		for i, m := range members {
			share := n / 3
			if i == 2 {
				share = n - 2*(n/3)
			}
			m.run(b, share)
		}
		for _, m := range members {
			m.done(b)
		}
		dCluster += time.Since(start)
		b.StopTimer()
		for i, m := range members {
			cMember[i] += m.cpu(b) - marks[i]
		}
	}
	for _, ch := range all {
		ch.quit(b)
	}

	perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	busiest := slices.Max(cMember)
	var others time.Duration
	for i, d := range cMember {
		if i != owner {
			others = max(others, d)
		}
	}
	b.ReportMetric(perOp(cLocal), "local-cpu-ns/op")
	b.ReportMetric(perOp(cMember[owner]), "owner-cpu-ns/op")
	b.ReportMetric(perOp(others), "other-member-cpu-ns/op")
	b.ReportMetric(float64(cLocal)/float64(busiest), "est-cluster/local")
	b.ReportMetric(dLocal.Seconds()/dCluster.Seconds(), "wall-cluster/local")
}

// childRole is the environment variable that makes the test binary a
// child of BenchmarkClusterProcesses (TestClusterProcessChild).
const childRole = "SINKBATCH_BENCH_CHILD"

func startChild(b *testing.B, role string, slot int, c *managed) *child {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterProcessChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), c.env()...), childRole+"="+role, fmt.Sprintf("SINKBATCH_BENCH_SLOT=%d", slot))
	return spawn(b, cmd, "BENCH ")
}

// cpu is the child's CPU time so far.
func (ch *child) cpu(b *testing.B) time.Duration {
	ch.say(b, "cpu")
	ns, err := strconv.ParseInt(ch.expect(b, "cpu"), 10, 64)
	require.NoError(b, err)
	return time.Duration(ns)
}

// run has the child make n deliveries; it says done when they are.
func (ch *child) run(b *testing.B, n int) { ch.say(b, fmt.Sprintf("run %d", n)) }

// done waits for the child's deliveries to end, none of them failed.
func (ch *child) done(b *testing.B) {
	b.Helper()
	require.Equal(b, "0", ch.expect(b, "done"), "deliveries failed")
}

// TestClusterProcessChild is a child process of BenchmarkClusterProcesses;
// run otherwise, it does nothing.
func TestClusterProcessChild(t *testing.T) {
	role := os.Getenv(childRole)
	if role == "" {
		t.Skip("a child process of BenchmarkClusterProcesses")
	}
	ctx := context.Background()
	msg := codec.Message{Body: []byte("benchmark body of a typical small event payload")}
	callers := benchCallers
	var deliver func(ctx context.Context) error
	var stop func()
	switch role {
	case "local":
		_, inst := testinst.Start(t, actors.Config{})
		dest := benchCodec("local", 0)
		deliver = func(ctx context.Context) error {
			_, err := inst.Deliver(ctx, dest, msg)
			return err
		}
		stop = func() {}
	case "member":
		callers /= 3
		slot, err := strconv.Atoi(os.Getenv("SINKBATCH_BENCH_SLOT"))
		require.NoError(t, err)
		c := managedFromEnv(t)
		m := c.start(t, slot, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec { return benchCodec(name, 0) }})
		stop = func() { m.leave(t) }
		require.Eventually(t, func() bool { return m.node.MembersSeen() == 3 }, time.Minute, 10*time.Millisecond)
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := m.node.Deliver(ctx, "dest", msg)
			return err == nil
		}, time.Minute, 10*time.Millisecond)
		deliver = func(ctx context.Context) error {
			_, err := m.node.Deliver(ctx, "dest", msg)
			return err
		}
	default:
		t.Fatalf("unknown role %q", role)
	}
	fmt.Println("BENCH ready")
	s := bufio.NewScanner(os.Stdin)
	for s.Scan() {
		cmd, arg, _ := strings.Cut(s.Text(), " ")
		switch cmd {
		case "cpu":
			fmt.Printf("BENCH cpu %d\n", cpuTime().Nanoseconds())
		case "run":
			n, err := strconv.Atoi(arg)
			require.NoError(t, err)
			var next, failed atomic.Int64
			var wg sync.WaitGroup
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(n) {
						ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						err := deliver(ctx)
						cancel()
						if err != nil && failed.Add(1) == 1 {
							fmt.Fprintln(os.Stderr, "delivery failed:", err)
						}
					}
				}()
			}
			wg.Wait()
			fmt.Printf("BENCH done %d\n", failed.Load())
		case "quit":
			stop()
			fmt.Println("BENCH quit")
			os.Exit(0)
		}
	}
}
