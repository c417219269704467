package actors_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/messages"
)

// readmeMarker is the HTML comment (invisible on GitHub) that ties the README
// code block after it to an example file:
//
//	<!-- program: actors/F -->  the block is F as a program: package main,
//	                            its Example function renamed main, without
//	                            the Output comment
//	<!-- output: actors/F -->   the block is F's Output comment
//	<!-- excerpt: actors/F -->  the block is a run of F's lines
var readmeMarker = regexp.MustCompile(`^<!-- (program|output|excerpt): (\S+) -->$`)

// TestReadmeCodeIsTheExamples keeps the README's Quick start and retry loop
// equal to the Example functions go test compiles and runs, so the README's
// code compiles and prints what it says.
func TestReadmeCodeIsTheExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	lines := strings.Split(string(readme), "\n")
	seen := map[string]int{}
	for i := 0; i < len(lines); i++ {
		m := readmeMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		kind, file := m[1], m[2]
		seen[kind]++
		src, err := os.ReadFile(filepath.Join("..", file))
		require.NoError(t, err, "README line %d names %s", i+1, file)
		block, end := fencedBlock(t, lines, i+1)
		i = end
		program, output := exampleAsProgram(t, string(src))
		switch kind {
		case "program":
			assert.Equal(t, program, block, "README's block after %q differs from %s as a program", m[0], file)
		case "output":
			assert.Equal(t, output, block, "README's output after %q differs from %s's Output comment", m[0], file)
		case "excerpt":
			assert.Contains(t, string(src), block, "README's excerpt after %q is not a run of %s's lines", m[0], file)
		}
	}
	// The Quick start's program and its output, and the retry loop.
	assert.Equal(t, map[string]int{"program": 1, "output": 1, "excerpt": 1}, seen)
}

// fencedBlock returns the fenced code block that starts on the first
// non-blank line at or after from, without its fences, and the index of its
// closing fence.
func fencedBlock(t *testing.T, lines []string, from int) (string, int) {
	t.Helper()
	for from < len(lines) && strings.TrimSpace(lines[from]) == "" {
		from++
	}
	require.Less(t, from, len(lines), "a README marker is not followed by a code block")
	require.True(t, strings.HasPrefix(lines[from], "```"), "README line %d: want a code fence after the marker, got %q", from+1, lines[from])
	for end := from + 1; end < len(lines); end++ {
		if lines[end] == "```" {
			return strings.Join(lines[from+1:end], "\n") + "\n", end
		}
	}
	t.Fatalf("README line %d: the code block never closes", from+1)
	return "", 0
}

// exampleAsProgram turns an example file holding one Example function into
// the program a user would write (package main, func main) and returns it
// with the Example's expected output.
func exampleAsProgram(t *testing.T, src string) (program, output string) {
	t.Helper()
	var prog, out strings.Builder
	inOutput, examples := false, 0
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "package actors_test":
			line = "package main"
		case strings.HasPrefix(line, "func Example") && strings.HasSuffix(line, "() {"):
			examples++
			line = "func main() {"
		case line == "\t// Output:":
			inOutput = true
			continue
		case inOutput && line == "}":
			inOutput = false
		case inOutput:
			out.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "\t//"), " ") + "\n")
			continue
		}
		prog.WriteString(line + "\n")
	}
	require.Equal(t, 1, examples, "an example file for the README holds one Example function")
	return prog.String(), out.String()
}

// TestRelayRetriesAfterQueueFull drives the relay of ExampleInstance_PID
// through refusals for certain: pstest holds the first Publish until more
// rows have been refused than the queue and that request can hold, and
// then every row must still be published exactly once.
func TestRelayRetriesAfterQueueFull(t *testing.T) {
	const rows, queueMax = 20, 4
	gate := &holdFirst{release: make(chan struct{})}
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: gate})
	t.Cleanup(func() { _ = srv.Close() })
	const topic = "projects/p/topics/relay"
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	dest, err := pubsub.New(context.Background(), pubsub.Config{
		Topic: topic, Endpoint: srv.Addr, Insecure: true,
		Tuning: codec.Tuning{QueueMax: queueMax, MaxInflight: 1, RetryAfterMax: 10 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dest.Close() })

	reader := sdkmetric.NewManualReader()
	system, inst := start(t, actors.Config{Name: "relay", MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	t.Cleanup(gate.open) // before the instance stops, should the test end early
	settled := make(chan Settled, rows)
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &relay{inst: inst, dest: dest, settled: settled}
	}))
	t.Cleanup(func() { _ = system.Root.StopFuture(pid).Wait() })
	for i := range rows {
		system.Root.Send(pid, &Row{ID: fmt.Sprintf("row-%02d", i), Tenant: "t", Body: []byte("x")})
	}

	// While the first request is held, at most queueMax rows are in it
	// and queueMax more are queued: every other row has been refused at
	// least once before the gate opens.
	require.Eventually(t, func() bool { return refusals(t, reader) >= rows-2*queueMax }, 10*time.Second, 5*time.Millisecond)
	gate.open()

	attempts := 0
	for range rows {
		select {
		case s := <-settled:
			require.NoError(t, s.Err, s.Row.ID)
			attempts += s.Attempts
		case <-time.After(10 * time.Second):
			t.Fatal("a row was never settled")
		}
	}
	assert.GreaterOrEqual(t, attempts, rows+rows-2*queueMax, "every refused row was sent again")
	var keys []string
	for _, m := range srv.Messages() {
		keys = append(keys, m.Attributes[pubsub.DefaultIdempotencyAttribute])
	}
	slices.Sort(keys)
	want := make([]string, rows)
	for i := range want {
		want[i] = fmt.Sprintf("row-%02d", i)
	}
	assert.Equal(t, want, keys, "each row published once")
}

// holdFirst is a pstest reactor that holds the first Publish until open is
// called and lets every request through. It runs under pstest's lock, so it
// touches nothing of the server.
type holdFirst struct {
	once    sync.Once
	release chan struct{}
	opened  sync.Once
}

func (h *holdFirst) React(any) (bool, any, error) {
	h.once.Do(func() { <-h.release })
	return false, nil, nil
}

func (h *holdFirst) open() { h.opened.Do(func() { close(h.release) }) }

// refusals sums the instance's ankusa.sink_batch.refused counter.
func refusals(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "ankusa.sink_batch.refused" {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestDeliverWithoutSenderIsSentButNotAnswered: a Deliver sent with
// ctx.Send is sent like any other, and its sender never hears of it; the
// one sent with ctx.Request beside it is answered.
func TestDeliverWithoutSenderIsSentButNotAnswered(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const topic = "projects/p/topics/nosender"
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	dest, err := pubsub.New(context.Background(), pubsub.Config{Topic: topic, Endpoint: srv.Addr, Insecure: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dest.Close() })
	system, inst := start(t, actors.Config{Name: "nosender"})

	answers := make(chan *messages.Delivered, 2)
	pid := system.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case string: // "send", then "flush": answered once what came before is handled
			if m == "send" {
				deliver := func(key string) *messages.Deliver {
					return &messages.Deliver{Codec: dest, Message: codec.Message{IdempotencyKey: key, Body: []byte(key)}, Ref: key}
				}
				ctx.Send(inst.PID(), deliver("sent"))
				ctx.Request(inst.PID(), deliver("requested"))
			}
			ctx.Respond(m)
		case *messages.Delivered:
			answers <- m
		}
	}))
	t.Cleanup(func() { _ = system.Root.StopFuture(pid).Wait() })
	_, err = system.Root.RequestFuture(pid, "send", 10*time.Second).Result()
	require.NoError(t, err)

	require.Eventually(t, func() bool { return len(srv.Messages()) == 2 }, 10*time.Second, 5*time.Millisecond, "both messages are published")
	select {
	case a := <-answers:
		assert.Equal(t, "requested", a.Ref)
		assert.NoError(t, a.Err)
	case <-time.After(10 * time.Second):
		t.Fatal("the requested Deliver was not answered")
	}
	// Stop answers every caller it knows of before it returns; a request
	// sent to the actor after that is handled after any answer.
	require.NoError(t, inst.Stop(context.Background()))
	_, err = system.Root.RequestFuture(pid, "flush", 10*time.Second).Result()
	require.NoError(t, err)
	assert.Empty(t, answers, "the Deliver sent without a sender was answered")
}
