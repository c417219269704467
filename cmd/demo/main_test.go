package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.NewServer starts every service kumo emulates; its DynamoDB
		// TTL reaper has no stop, and kumo.Server.Close leaves it running.
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"),
		// Started by go.opencensus.io's init, which the Google client
		// libraries import; it runs for the life of the process.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// syncBuffer is a bytes.Buffer that the test reads while run writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testArgs keep a run short and light enough for go test -race on two
// shared cores.
var testArgs = []string{"-duration", "3s", "-load", "0.2", "-log-level", "warn"}

// TestRun runs the whole demo: every scripted event happens, and the read
// back finds nothing lost or out of order.
func TestRun(t *testing.T) {
	var stdout, stderr syncBuffer
	code := run(context.Background(), testArgs, &stdout, &stderr)
	out := stdout.String()
	t.Log("\n" + out)
	require.Equal(t, 0, code, "stderr:\n%s", stderr.String())
	assert.Contains(t, out, "\nlost: 0\n")
	assert.Contains(t, out, "\norder violations: 0\n")
	assert.Contains(t, out, "poison: refused for good after 1 attempt(s), not stored")
	assert.Contains(t, out, "the marked message: delivered after 2 attempts")
	assert.Regexp(t, `burst: \d+ callers at once on sqs-burst: [1-9]\d* refusals`, out)
	assert.Contains(t, out, "idle: pubsub-audit's batcher stopped")
	assert.Contains(t, out, "stop: every delivery answered")
	// A progress line a second.
	assert.Regexp(t, `(?m)^\s+2s  delivered\s+\d+/s  queued`, stderr.String())
}

// TestMetrics scrapes /metrics while the demo runs and finds the refusals
// the burst causes.
func TestMetrics(t *testing.T) {
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), append([]string{"-metrics-addr", "127.0.0.1:0"}, testArgs...), &stdout, &stderr)
	}()
	addr := regexp.MustCompile(`metrics: serving (http://\S+/metrics)`)
	var url string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond)

	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	var body string
	assert.Eventually(t, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && strings.Contains(body, "ankusa_sink_batch_refused_total{")
	}, 10*time.Second, 100*time.Millisecond, "no refusals in /metrics:\n%s", body)
	assert.Contains(t, body, "ankusa_sink_batch_flush_requests_total{")

	select {
	case code := <-done:
		assert.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("the demo did not end")
	}
}
