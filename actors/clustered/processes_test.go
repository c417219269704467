//go:build unix

package clustered_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// child is a test's process of its own: a re-run of the test binary (built
// as the test was: under -race, so is the child), driven by lines on its
// stdin and answering with lines on its stdout.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string // the answers, closed once its stdout ends
	// out is everything else it wrote, on stdout and stderr: what the
	// test prints when the child fails (a data race report, a failed
	// require, the node's warnings).
	out   *testinst.Buffer
	ended chan struct{}
	err   error // how the process ended; set before ended closes
	told  bool  // the test printed out
}

// raceReport is how the race detector opens each report; a child that made
// one exits 66 when it ends by itself.
const raceReport = "WARNING: DATA RACE"

// protoactorRaces is the file of data races inside protoactor that the
// race detector of a child is told to pass over: a member reports them
// even alone in its process.
func protoactorRaces(tb testing.TB) string {
	path, err := filepath.Abs(filepath.Join("testdata", "protoactor.supp"))
	require.NoError(tb, err)
	return path
}

// spawn starts cmd, a re-run of the test binary as a child, and returns it:
// the lines it writes to stdout that begin with prefix arrive, without it,
// on lines. Its race detector passes over protoactorRaces. At clean-up it
// is killed (continued first, in case a test stopped it); the test fails,
// with all the child wrote, if the child reported a data race, and prints
// what it wrote if the test failed otherwise.
func spawn(tb testing.TB, cmd *exec.Cmd, prefix string) *child {
	tb.Helper()
	ch := &child{cmd: cmd, lines: make(chan string, 16), out: &testinst.Buffer{}, ended: make(chan struct{})}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" suppressions="+protoactorRaces(tb)))
	cmd.Stderr = ch.out
	in, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	ch.in = in
	go func() {
		defer close(ch.lines)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if line, ok := strings.CutPrefix(s.Text(), prefix); ok {
				ch.lines <- line
			} else {
				fmt.Fprintln(ch.out, s.Text())
			}
		}
		// Wait only once stdout is read to its end, as exec requires.
		ch.err = cmd.Wait()
		close(ch.ended)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		// Drain the answers nobody took, so that the reader reaches
		// the end of stdout.
		for range ch.lines {
		}
		<-ch.ended
		ch.noRace(tb)
		if tb.Failed() && !ch.told {
			tb.Logf("the child (pid %d) wrote:\n%s", ch.cmd.Process.Pid, ch.wrote())
		}
	})
	return ch
}

// noRace fails the test, with all the child wrote, if it reported a data
// race.
func (ch *child) noRace(tb testing.TB) {
	tb.Helper()
	if strings.Contains(ch.out.String(), raceReport) && !ch.told {
		tb.Errorf("the child (pid %d) reported a data race:\n%s", ch.cmd.Process.Pid, ch.wrote())
	}
}

// expect waits for the child's next line, which must begin with word, and
// returns the rest.
func (ch *child) expect(tb testing.TB, word string) string {
	tb.Helper()
	timer := time.NewTimer(2 * time.Minute)
	defer timer.Stop()
	select {
	case line, ok := <-ch.lines:
		if !ok {
			ch.failEnded(tb, fmt.Sprintf("before it said %q", word))
		}
		rest, found := strings.CutPrefix(line, word)
		require.True(tb, found, "the child said %q, not %q", line, word)
		return strings.TrimSpace(rest)
	case <-timer.C:
		tb.Fatalf("the child did not say %q; it wrote:\n%s", word, ch.wrote())
		return ""
	}
}

// await waits up to within for the child to say a line that begins with
// word, skipping other lines, and returns the rest of it.
func (ch *child) await(tb testing.TB, word string, within time.Duration) string {
	tb.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-ch.lines:
			if !ok {
				ch.failEnded(tb, fmt.Sprintf("before it said %q", word))
			}
			if rest, found := strings.CutPrefix(line, word); found {
				return strings.TrimSpace(rest)
			}
		case <-timer.C:
			tb.Fatalf("the child did not say %q within %v; it wrote:\n%s", word, within, ch.wrote())
			return ""
		}
	}
}

// failEnded stops the test: the child ended when it should not have.
func (ch *child) failEnded(tb testing.TB, when string) {
	tb.Helper()
	<-ch.ended
	tb.Fatalf("the child (pid %d) ended %s (%v); it wrote:\n%s", ch.cmd.Process.Pid, when, ch.err, ch.wrote())
}

// wrote is all the child wrote but its answers, for the test to print
// (once: the clean-up prints it if the test failed and nothing did).
func (ch *child) wrote() string {
	ch.told = true
	return ch.out.String()
}

func (ch *child) say(tb testing.TB, line string) {
	tb.Helper()
	_, err := fmt.Fprintln(ch.in, line)
	require.NoError(tb, err)
}

// quit tells the child to quit and waits for it to say so and to end by
// itself, which it must: a race-built child that reported a data race
// ends with exit code 66.
func (ch *child) quit(tb testing.TB) {
	tb.Helper()
	ch.say(tb, "quit")
	ch.await(tb, "quit", 2*time.Minute)
	ch.waitEnd(tb)
}

// kill kills the child (SIGKILL) and waits until it has ended.
func (ch *child) kill(tb testing.TB) {
	tb.Helper()
	require.NoError(tb, ch.cmd.Process.Kill())
	for range ch.lines {
	}
	<-ch.ended
}

// hasEnded reports whether the child has ended and its output was read.
func (ch *child) hasEnded() bool {
	select {
	case <-ch.ended:
		return true
	default:
		return false
	}
}

// waitEnd waits for the child to end by itself, which it must with exit
// code 0.
func (ch *child) waitEnd(tb testing.TB) {
	tb.Helper()
	for range ch.lines {
	}
	<-ch.ended
	if ch.err != nil {
		tb.Fatalf("the child (pid %d) ended with %v; it wrote:\n%s", ch.cmd.Process.Pid, ch.err, ch.wrote())
	}
}

// env hands c to a child: managedFromEnv there reads it back.
func (c *managed) env() []string {
	var health, remotes []string
	for i := range c.health {
		health = append(health, strconv.Itoa(c.health[i]))
		remotes = append(remotes, strconv.Itoa(c.remotes[i]))
	}
	return []string{"SINKBATCH_CLUSTER_HEALTH=" + strings.Join(health, ","), "SINKBATCH_CLUSTER_REMOTES=" + strings.Join(remotes, ",")}
}

// managedFromEnv is, in a child, the cluster its parent handed it with
// env.
func managedFromEnv(t *testing.T) *managed {
	c := &managed{}
	for _, p := range strings.Split(os.Getenv("SINKBATCH_CLUSTER_HEALTH"), ",") {
		c.health = append(c.health, envInt(t, p))
		c.hosts = append(c.hosts, "127.0.0.1:"+p)
	}
	for _, p := range strings.Split(os.Getenv("SINKBATCH_CLUSTER_REMOTES"), ",") {
		c.remotes = append(c.remotes, envInt(t, p))
	}
	return c
}

// envInt is v, a number a parent handed its child.
func envInt(t *testing.T, v string) int {
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// lazyPubSub is a member's Pub/Sub codec for topic name on the server at
// addr, with a client that dials at its first request, after the member
// started: protoactor's remote sets gRPC's global logger as it starts,
// which races a connection already dialling.
func lazyPubSub(t *testing.T, addr, name string, tuning codec.Tuning) codec.Codec {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	client, err := apiv1.NewTopicAdminClient(context.Background(), option.WithGRPCConn(conn))
	require.NoError(t, err)
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testProject + "/topics/" + name, Client: client, Tuning: tuning})
	require.NoError(t, err)
	return c
}
