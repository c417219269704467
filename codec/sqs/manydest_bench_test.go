package sqs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/awssnssqs"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/manybench"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// BenchmarkManyDestinations compares, in one run on one kumo server with
// 1024 standard queues, sinkbatch with this codec (one codec per queue from
// one aws.Config; Linger 5ms, 10 entries a request) against gocloud.dev's
// SQS topic (awssnssqs.OpenSQSTopicV2, one per queue on one SQS client, its
// default batching: up to 10 messages a request, 100 requests in flight a
// topic, no delay), as a relay that spreads its traffic over a queue per
// customer would use them. 2048 callers each wait for their message's
// answer before sending the next; caller c sends its k-th message to queue
// (c+k) mod 1024. Each iteration sends one message through each side, in 4
// rounds a side that alternate (see manybench.Run, which says what it
// reports). Both sides share one HTTP transport (up to 256 idle connections),
// which counts the SendMessageBatch requests and reads their messages' send
// times.
func BenchmarkManyDestinations(b *testing.B) {
	const queues, callers = 1024, 2048
	shape := manybench.Shape{Destinations: queues, Callers: callers, Rounds: 4, Body: deliverBody, Probe: codec.DefaultLinger}
	e := newKumo(b)
	count := manybench.NewCounter()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	b.Cleanup(tr.CloseIdleConnections)
	e.cfg.HTTPClient = &http.Client{Transport: &countingTransport{next: tr, count: count}}
	urls := make([]string, queues)
	for i := range urls {
		urls[i] = e.createQueue(b, false, false)
	}
	purge := func() {
		for _, q := range urls {
			_, err := e.admin.PurgeQueue(context.Background(), &awssqs.PurgeQueueInput{QueueUrl: aws.String(q)})
			require.NoError(b, err)
		}
	}

	ctx := context.Background()
	client := awssqs.NewFromConfig(e.cfg)
	topics := make([]*pubsub.Topic, queues)
	for i, q := range urls {
		topics[i] = awssnssqs.OpenSQSTopicV2(ctx, client, q, nil)
	}
	b.Cleanup(func() {
		for _, t := range topics {
			require.NoError(b, t.Shutdown(context.Background()))
		}
	})
	codecs := make([]*sqs.Codec, queues)
	for i, q := range urls {
		c, err := sqs.New(sqs.Config{QueueURL: q, AWS: e.cfg, AttributeChecksumsOptional: true, Tuning: codec.Tuning{Linger: codec.DefaultLinger}})
		require.NoError(b, err)
		codecs[i] = c
	}
	_, inst := testinst.Start(b, actors.Config{})

	tenants := make([]string, callers) // made once, so that no side pays for formatting them
	for i := range tenants {
		tenants[i] = fmt.Sprint("t", i%8)
	}
	gocloud := &manybench.Side{Name: "gocloud", Send: func(_, q int, body []byte) (string, error) {
		// Send keeps no reference to Body once it returns.
		if err := topics[q].Send(ctx, &pubsub.Message{Body: body}); err != nil {
			return "", err
		}
		return "sent", nil // gocloud gives no message id
	}}
	sinkbatch := &manybench.Side{Name: "sinkbatch", Send: func(caller, q int, body []byte) (string, error) {
		return inst.Deliver(ctx, codecs[q], codec.Message{Tenant: tenants[caller], Body: body})
	}}
	manybench.Run(b, shape, count, purge, sinkbatch, gocloud)
}

// countingTransport counts each SendMessageBatch request that passes it,
// with its messages' bodies, in count.
type countingTransport struct {
	next  http.RoundTripper
	count *manybench.Counter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") == "AmazonSQS.SendMessageBatch" && req.Body != nil {
		raw, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(raw))
		var in struct {
			Entries []struct{ MessageBody string }
		}
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, fmt.Errorf("counting transport: %w", err)
		}
		bodies := make([][]byte, len(in.Entries))
		for i, en := range in.Entries {
			bodies[i] = []byte(en.MessageBody)
		}
		t.count.Request(bodies)
	}
	return t.next.RoundTrip(req)
}
