package sqstest_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/internal/sqstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.Server.Close leaves its DynamoDB emulator's TTL reaper
		// running (see codec/sqs's TestMain).
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"),
	)
}

// env is kumo, a proxy in front of it, a client of the proxy (one attempt
// per call, so that what the proxy does reaches the test) and an admin
// client of kumo.
type env struct {
	proxy         *sqstest.Proxy
	client, admin *awssqs.Client
	queue         string
}

func newEnv(t *testing.T, fifo bool) *env {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	p := sqstest.New(t, srv.URL)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDPROXY", "secret-proxy", ""),
		HTTPClient:  &http.Client{Transport: tr},
		Retryer:     func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 1) },
	}
	admin := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	client := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(p.URL) })
	name, attrs := "proxy", map[string]string{}
	if fifo {
		name, attrs = "proxy.fifo", map[string]string{"FifoQueue": "true", "ContentBasedDeduplication": "true"}
	}
	out, err := admin.CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	require.NoError(t, err)
	return &env{proxy: p, client: client, admin: admin, queue: aws.ToString(out.QueueUrl)}
}

// send sends bodies in one SendMessageBatch call, entry i with Id "i", in
// group g on a FIFO queue.
func (e *env) send(ctx context.Context, fifo bool, bodies ...string) (*awssqs.SendMessageBatchOutput, error) {
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(e.queue)}
	for i, b := range bodies {
		en := types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(b)}
		if fifo {
			en.MessageGroupId = aws.String("g")
		}
		in.Entries = append(in.Entries, en)
	}
	return e.client.SendMessageBatch(ctx, in)
}

func bodies(rs []sqstest.Received) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Body)
	}
	return out
}

// TestFailTakesEntriesOut: a failed entry is answered in Failed and never
// stored; the others are stored and answered in Successful. When every
// entry fails, the server never sees the call.
func TestFailTakesEntriesOut(t *testing.T) {
	e := newEnv(t, false)
	e.proxy.Set(func(*sqstest.Call) sqstest.Action {
		return sqstest.Action{Fail: func(en map[string]any) map[string]any {
			if en["MessageBody"] == "a" || en["MessageBody"] == "c" {
				return nil
			}
			return sqstest.Failure(en["Id"], "InternalError", "injected", false)
		}}
	})
	out, err := e.send(context.Background(), false, "a", "b", "c", "d")
	require.NoError(t, err)
	var ok, failed []string
	for _, s := range out.Successful {
		ok = append(ok, aws.ToString(s.Id))
	}
	for _, f := range out.Failed {
		failed = append(failed, aws.ToString(f.Id))
		assert.Equal(t, "InternalError", aws.ToString(f.Code))
		assert.False(t, f.SenderFault)
	}
	sort.Strings(ok)
	assert.Equal(t, []string{"0", "2"}, ok)
	assert.Equal(t, []string{"1", "3"}, failed)
	got := bodies(sqstest.ReadBack(t, e.admin, e.queue))
	sort.Strings(got)
	assert.Equal(t, []string{"a", "c"}, got)

	out, err = e.send(context.Background(), false, "b")
	require.NoError(t, err)
	assert.Empty(t, out.Successful)
	require.Len(t, out.Failed, 1)
	assert.Empty(t, sqstest.ReadBack(t, e.admin, e.queue))
	assert.EqualValues(t, 2, e.proxy.Calls())
}

// TestAfterStoresThenAnswersLate: with After, the messages are stored at
// once and a caller that stops waiting first gets no answer.
func TestAfterStoresThenAnswersLate(t *testing.T) {
	e := newEnv(t, true)
	e.proxy.Set(func(*sqstest.Call) sqstest.Action { return sqstest.Action{After: 10 * time.Second} })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := e.send(ctx, true, "x", "y")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, []string{"x", "y"}, bodies(sqstest.ReadBack(t, e.admin, e.queue)), "stored, in order")
}

// TestBeforeHoldsTheCall: with Before, a caller that stops waiting first
// gets no answer and nothing is stored.
func TestBeforeHoldsTheCall(t *testing.T) {
	e := newEnv(t, false)
	e.proxy.Set(func(*sqstest.Call) sqstest.Action { return sqstest.Action{Before: 10 * time.Second} })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := e.send(ctx, false, "x")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Empty(t, sqstest.ReadBack(t, e.admin, e.queue))
}

// TestErrorAnswers: Error's answer reaches the SDK as SQS's own would, and
// Reset as a connection error; other calls than SendMessageBatch pass.
func TestErrorAnswers(t *testing.T) {
	e := newEnv(t, false)
	e.proxy.Set(sqstest.Always(sqstest.Error(http.StatusBadRequest, "ThrottlingException", "Rate exceeded")))
	_, err := e.send(context.Background(), false, "x")
	require.ErrorContains(t, err, "ThrottlingException")
	require.ErrorContains(t, err, "StatusCode: 400")
	_, err = e.client.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(e.queue)})
	require.NoError(t, err, "only SendMessageBatch calls see the Fault")

	e.proxy.Set(sqstest.Always(sqstest.Reset))
	_, err = e.send(context.Background(), false, "x")
	require.ErrorContains(t, err, "connection reset")
	assert.Empty(t, sqstest.ReadBack(t, e.admin, e.queue))
}
