package sqs_test

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/sivchari/kumo"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// A codec for a FIFO queue, here on kumo, an SQS emulator. In production
// the aws.Config comes from config.LoadDefaultConfig and the codec goes to
// an actors.Instance's Deliver; SendBatch is what the batcher calls.
func ExampleNew() {
	srv := kumo.NewServer()
	defer srv.Close()
	cfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		BaseEndpoint: aws.String(srv.URL),
	}
	ctx := context.Background()
	q, err := awssqs.NewFromConfig(cfg).CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName:  aws.String("orders.fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		panic(err)
	}

	// kumo never returns MD5OfMessageAttributes; Amazon SQS does.
	c, err := sqs.New(sqs.Config{QueueURL: aws.ToString(q.QueueUrl), AWS: cfg, AttributeChecksumsOptional: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Name(), c.FIFO(), c.Limits().MaxEntries, c.Limits().MaxBytes)

	// A FIFO queue needs a group and, without content-based
	// deduplication, an idempotency key.
	fmt.Println(c.Validate(codec.Message{Body: []byte("no group"), IdempotencyKey: "k0"}))

	res, err := c.SendBatch(ctx, []codec.Message{
		{Group: "customer-1", IdempotencyKey: "order-1", Body: []byte(`{"order":1}`)},
		{Group: "customer-1", IdempotencyKey: "order-2", Body: []byte(`{"order":2}`), Attributes: map[string]string{"kind": "refund"}},
	})
	if err != nil {
		panic(err)
	}
	for _, r := range res {
		fmt.Println(r.Err == nil && r.ID != "", r.Sequence != "")
	}
	// Output:
	// sqs true 10 1048576
	// sinkbatch: permanent failure MissingMessageGroupId: a FIFO queue needs a Group (MessageGroupId) on every message
	// true true
	// true true
}
