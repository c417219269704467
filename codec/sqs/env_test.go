package sqs_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/codectest"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.Server.Close stops the HTTP server but not the services
		// behind it; its DynamoDB emulator's TTL reaper runs on. Nothing
		// of this package's own is ignored.
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"),
	)
}

// fauxqsEnv names the variable .ci/fauxqs/start.sh exports.
const fauxqsEnv = "SINKBATCH_FAUXQS_ENDPOINT"

// env is one SQS-compatible server and the means to talk to it: the
// aws.Config the codecs get and an admin client for queues and read back.
type env struct {
	kind     string // "kumo" or "fauxqs"
	endpoint string
	cfg      aws.Config
	admin    *awssqs.Client
}

// newKumo starts kumo in-process; it stops with the test.
func newKumo(t testing.TB) *env {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	return newEnv(t, "kumo", srv.URL)
}

// newFauxqs connects to the fauxqs that .ci/fauxqs/start.sh started, or
// skips the test.
func newFauxqs(t testing.TB) *env {
	t.Helper()
	ep := os.Getenv(fauxqsEnv)
	if ep == "" {
		t.Skipf("%s is unset: run `eval \"$(bash .ci/fauxqs/start.sh)\"` first to run the fauxqs tests", fauxqsEnv)
	}
	return newEnv(t, "fauxqs", ep)
}

// newEnv makes the config for endpoint with its own HTTP transport, closed
// with the test so no idle connection outlives it, and a retryer whose
// backoff is short enough for fault tests.
func newEnv(t testing.TB, kind, endpoint string) *env {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret-test", ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   &http.Client{Transport: tr},
		Retryer:      fastRetryer,
	}
	// The admin client gets the codec's fix for aws-sdk-go-v2 issue 2737
	// (see body.go) by hand, so that read back rarely loses an answer.
	admin := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		o.HTTPClient = &http.Client{Transport: readOnlyBodies{tr}}
	})
	return &env{kind: kind, endpoint: endpoint, cfg: cfg, admin: admin}
}

// readOnlyBodies hands net/http request bodies with Read and Close only.
type readOnlyBodies struct{ next http.RoundTripper }

func (t readOnlyBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r = r.Clone(r.Context())
		r.Body = struct{ io.ReadCloser }{r.Body}
	}
	return t.next.RoundTrip(r)
}

// fastRetryer is the SDK's standard retryer (3 attempts) with a backoff of
// at most 5ms.
func fastRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 5 * time.Millisecond })
}

var queueSeq atomic.Int64

// createQueue makes a fresh queue and returns its URL.
func (e *env) createQueue(t testing.TB, fifo, cbd bool) string {
	t.Helper()
	return e.createQueueWith(t, fifo, cbd, map[string]string{})
}

// createQueueWith makes a fresh queue with attrs and returns its URL.
func (e *env) createQueueWith(t testing.TB, fifo, cbd bool, attrs map[string]string) string {
	t.Helper()
	name := fmt.Sprintf("sinkbatch-%d-%d", time.Now().UnixNano()%1e9, queueSeq.Add(1))
	if fifo {
		name += ".fifo"
		attrs["FifoQueue"] = "true"
		attrs["ContentBasedDeduplication"] = fmt.Sprint(cbd)
	}
	out, err := e.admin.CreateQueue(ctx(t), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	require.NoError(t, err)
	return aws.ToString(out.QueueUrl)
}

// codec makes a codec for queueURL from the env's aws.Config.
func (e *env) codec(t *testing.T, queueURL string, tuning codec.Tuning, edit ...func(*sqs.Config)) *sqs.Codec {
	t.Helper()
	cfg := sqs.Config{QueueURL: queueURL, AWS: e.cfg, Tuning: tuning, IdempotencyAttribute: "idem",
		// kumo never returns MD5OfMessageAttributes.
		AttributeChecksumsOptional: e.kind == "kumo"}
	for _, f := range edit {
		f(&cfg)
	}
	c, err := sqs.New(cfg)
	require.NoError(t, err)
	return c
}

// message is a received SQS message with what the tests compare.
type message struct {
	codectest.Received
	Sequence string
	DedupID  string
}

// drain receives and deletes the messages queueURL holds now, in arrival
// order, and never waits for more. A received message stays invisible for
// one second only: the SDK sometimes loses an answer on a connection it
// closes early (aws/aws-sdk-go-v2#2737) and retries, and the messages of the
// lost answer then come back soon rather than after the queue's 30 seconds.
func (e *env) drain(t *testing.T, queueURL string) []message {
	t.Helper()
	var all []message
	for {
		out, err := e.admin.ReceiveMessage(ctx(t), &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(queueURL),
			MaxNumberOfMessages:         10,
			VisibilityTimeout:           1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			return all
		}
		var del []types.DeleteMessageBatchRequestEntry
		for i, m := range out.Messages {
			r := message{Received: codectest.Received{
				ID:         aws.ToString(m.MessageId),
				Body:       []byte(aws.ToString(m.Body)),
				Attributes: map[string]string{},
				Group:      m.Attributes["MessageGroupId"],
			}, Sequence: m.Attributes["SequenceNumber"], DedupID: m.Attributes["MessageDeduplicationId"]}
			for k, v := range m.MessageAttributes {
				if k == "idem" {
					r.IdempotencyKey = aws.ToString(v.StringValue)
					continue
				}
				r.Attributes[k] = aws.ToString(v.StringValue)
			}
			if len(r.Attributes) == 0 {
				r.Attributes = nil
			}
			all = append(all, r)
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
		}
		_, err = e.admin.DeleteMessageBatch(ctx(t), &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del})
		require.NoError(t, err)
	}
}

// readBack drains queueURL until it has seen n distinct messages (waiting
// for lost ones to come back, see drain) and returns them in order of first
// arrival, each once.
func (e *env) readBack(t *testing.T, queueURL string, n int) []message {
	t.Helper()
	var all []message
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		for _, m := range e.drain(t, queueURL) {
			if !seen[m.ID] {
				seen[m.ID] = true
				all = append(all, m)
			}
		}
		return len(all) >= n
	}, 10*time.Second, 20*time.Millisecond, "want %d messages, have %d", n, len(all))
	// Anything more is there already: one more pass finds it.
	for _, m := range e.drain(t, queueURL) {
		if !seen[m.ID] {
			seen[m.ID] = true
			all = append(all, m)
		}
	}
	return all
}

// harness runs codectest against one kind of queue of an env.
type harness struct {
	env      *env
	client   *awssqs.Client // shared by MakeCodec and Retune, see MakeCodec
	fifo     bool
	queueURL string
	got      []codectest.Received
	seen     map[string]bool
}

func (h *harness) MakeCodec(t *testing.T, tuning codec.Tuning) codec.Codec {
	h.queueURL = h.env.createQueue(t, h.fifo, false)
	h.got, h.seen = nil, map[string]bool{}
	// The env's aws.Config holds a Retryer func, which makes each codec
	// built from it unique; codecs built on one client share an Identity,
	// as the suite's Retune requires.
	h.client = awssqs.NewFromConfig(h.env.cfg)
	return h.withClient(t, h.queueURL, tuning)
}

func (h *harness) Retune(t *testing.T, c codec.Codec, tuning codec.Tuning) codec.Codec {
	return h.withClient(t, c.(*sqs.Codec).QueueURL(), tuning)
}

func (h *harness) withClient(t *testing.T, queueURL string, tuning codec.Tuning) codec.Codec {
	return h.env.codec(t, queueURL, tuning, func(c *sqs.Config) { c.AWS, c.Client = aws.Config{}, h.client })
}

func (h *harness) Received(t *testing.T) []codectest.Received {
	for _, m := range h.env.drain(t, h.queueURL) {
		if !h.seen[m.ID] { // see drain
			h.seen[m.ID] = true
			h.got = append(h.got, m.Received)
		}
	}
	return h.got
}

// Unreported: kumo returns no MessageGroupId on receive; fauxqs returns it
// on FIFO queues only (it drops the group of a standard queue's message). A
// standard queue does not promise order.
func (h *harness) Unreported() []codectest.Field {
	var f []codectest.Field
	if h.env.kind == "kumo" || !h.fifo {
		f = append(f, codectest.FieldGroup)
	}
	if !h.fifo {
		f = append(f, codectest.FieldOrder)
	}
	return f
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// batchOf makes n valid messages for a FIFO or standard queue, spread over
// groups groups; run makes bodies and keys unique.
func batchOf(run string, from, n, groups int) []codec.Message {
	b := make([]codec.Message, n)
	for i := range b {
		k := from + i
		b[i] = codec.Message{
			Group:          fmt.Sprintf("%s-g%d", run, k%groups),
			IdempotencyKey: fmt.Sprintf("%s-k%d", run, k),
			Body:           []byte(fmt.Sprintf("%s message %d", run, k)),
			Attributes:     map[string]string{"n": fmt.Sprint(k)},
		}
	}
	return b
}

func runName(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
}
