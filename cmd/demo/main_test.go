package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/internal/testinst"
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

// testArgs keep a run short and light enough for go test -race on two
// shared cores.
var testArgs = []string{"-duration", "3s", "-load", "0.2", "-log-level", "warn"}

// runArgs are testArgs with three seconds more: room for the idle stop and
// the restart after it when the machine is slow (the audit destination's
// pause lasts up to 60 % of the run; at 4 s, a -race run beside another
// package's saw no idle stop in it).
var runArgs = append([]string{"-duration", "6s"}, testArgs[2:]...)

// TestRun runs the whole demo: every scripted event happens, and the read
// back finds nothing lost or out of order.
func TestRun(t *testing.T) {
	var stdout, stderr testinst.Buffer
	code := run(context.Background(), runArgs, &stdout, &stderr)
	out := stdout.String()
	t.Log("\n" + out)
	require.Equal(t, 0, code, "stderr:\n%s", stderr.String())
	assert.Contains(t, out, "\nlost: 0\n")
	assert.Contains(t, out, "\norder violations: 0\n")
	assert.Contains(t, out, "poison: refused for good after 1 attempt(s), not stored")
	assert.Contains(t, out, "panicked in Size for the marked message: refused for good after 1 attempt(s) (codec.ErrCodecPanic); 0 other answers were ErrBatcherDown")
	assert.Regexp(t, `burst: \d+ callers at once on sqs-burst: [1-9]\d* refusals`, out)
	assert.Regexp(t, `idle: pubsub-audit paused \S+; its batcher stopped after \S+ without traffic and started again when it resumed \(batchers 8 -> 7 -> 8\)`, out)
	assert.Regexp(t, `block: \d+ callers at once on sqs-block \(WhenFull Block\): 0 refusals; up to [1-9]\d* deliveries waited for room`, out)
	assert.Regexp(t, `strict groups: sqs-strict.fifo failed [1-9]\d* requests on purpose; \d+ deliveries answered GroupPausedError until their group's failed message was retried; 0 stored out of order`, out)
	assert.Regexp(t, `adaptive: sqs-adaptive's in-flight limit was ([1-9]|1[0-6]) of MaxInflight 16 when the load ended`, out)
	assert.Contains(t, out, "stop: every delivery answered")
	// A progress line a second.
	assert.Regexp(t, `(?m)^\s+2s\s+\d+/s  queued=\d+ inflight=`, stderr.String())
}

// TestMetrics scrapes /metrics while the demo runs and finds the refusals
// the burst causes. It also runs the -sqs-endpoint mode: the demo creates
// its queues on an SQS server it did not start, through the AWS default
// credential chain, and reads them back.
func TestMetrics(t *testing.T) {
	awsEnv(t)
	sqsSrv := kumo.NewServer()
	defer sqsSrv.Close()
	var stdout, stderr testinst.Buffer
	var code int
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		args := append([]string{"-metrics-addr", "127.0.0.1:0", "-sqs-endpoint", sqsSrv.URL}, testArgs...)
		code = run(context.Background(), args, &stdout, &stderr)
	}()
	// The run ends by itself; wait for it even when an assertion below
	// stops the test, so that goleak sees nothing of it.
	t.Cleanup(func() { <-finished })
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
	case <-finished:
		out := stdout.String()
		assert.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, stderr.String())
		assert.Contains(t, out, "SQS: queues created at "+sqsSrv.URL)
		assert.Contains(t, out, "\nlost: 0\n")
	case <-time.After(60 * time.Second):
		t.Fatal("the demo did not end")
	}
}

// awsEnv gives the AWS default credential chain static credentials and
// nothing else to find: no files, no instance metadata (no network).
func awsEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           "demo",
		"AWS_SECRET_ACCESS_KEY":       "demo-secret",
		"AWS_REGION":                  "us-east-1",
		"AWS_CONFIG_FILE":             dir + "/none",
		"AWS_SHARED_CREDENTIALS_FILE": dir + "/none",
		"AWS_EC2_METADATA_DISABLED":   "true",
		"PUBSUB_EMULATOR_HOST":        "",
	} {
		t.Setenv(k, v)
	}
}

// TestExternal points the demo at servers it did not start, as it would be
// pointed at real services: an existing queue through the AWS default
// credential chain, and a topic at an endpoint. Nothing is read back then;
// the test counts what arrived itself.
func TestExternal(t *testing.T) {
	awsEnv(t)
	sqsSrv := kumo.NewServer()
	defer sqsSrv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	admin := awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(sqsSrv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("demo", "demo-secret", ""),
		HTTPClient:  &http.Client{Transport: tr},
	})
	q, err := admin.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("external-%d", time.Now().UnixNano()))})
	require.NoError(t, err)

	psSrv := pstest.NewServerWithAddress("127.0.0.1:0")
	defer func() { _ = psSrv.Close() }()
	const topic = "projects/external/topics/demo"
	_, err = psSrv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)

	var stdout, stderr testinst.Buffer
	args := append([]string{
		"-sqs-queue-url", aws.ToString(q.QueueUrl), "-sqs-endpoint", sqsSrv.URL,
		"-pubsub-topic", topic, "-pubsub-endpoint", psSrv.Addr,
	}, testArgs...)
	code := run(context.Background(), args, &stdout, &stderr)
	out := stdout.String()
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, stderr.String())
	assert.Contains(t, out, "not read back, so not checked: sqs-orders.fifo")
	assert.Contains(t, out, "poison: not sent")
	assert.NotContains(t, out, "kumo at", "the embedded servers are not started")

	attrs, err := admin.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: q.QueueUrl, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages},
	})
	require.NoError(t, err)
	assert.NotEqual(t, "0", attrs.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	assert.NotEmpty(t, psSrv.Messages())
}
