package sqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/sivchari/kumo"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// Orders go to a FIFO queue through a sinkbatch instance; here the queue is
// on kumo, an SQS emulator running in-process, as in a test. In production
// the aws.Config comes from config.LoadDefaultConfig and the queue already
// exists.
func Example() {
	srv := kumo.NewServer()
	defer srv.Close()
	cfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		BaseEndpoint: aws.String(srv.URL),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := awssqs.NewFromConfig(cfg)
	q, err := admin.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName:  aws.String("orders.fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		panic(err)
	}

	// One codec per queue; keep it and pass the same value to every
	// Deliver. kumo, unlike SQS, returns no checksum of the attributes.
	orders, err := sqs.New(sqs.Config{QueueURL: aws.ToString(q.QueueUrl), AWS: cfg, AttributeChecksumsOptional: true})
	if err != nil {
		panic(err)
	}

	// protoactor logs every actor's start and stop: route its logs (here,
	// nowhere) with its logger factory.
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "orders"})
	if err != nil {
		panic(err)
	}
	defer func() {
		if err := inst.Stop(ctx); err != nil {
			panic(err)
		}
	}()

	// A FIFO queue needs a group; the idempotency key becomes the
	// deduplication id. A message SQS would refuse is answered at once.
	_, err = inst.Deliver(ctx, orders, codec.Message{Body: []byte("no group"), IdempotencyKey: "order-0"})
	fmt.Println(err)
	for i := 1; i <= 3; i++ {
		id, err := inst.Deliver(ctx, orders, codec.Message{
			Tenant:         "shop-1",
			Group:          "customer-42",
			IdempotencyKey: fmt.Sprintf("order-%d", i),
			Body:           []byte(fmt.Sprintf(`{"order":%d}`, i)),
		})
		fmt.Println(id != "", err)
	}

	out, err := admin.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, MaxNumberOfMessages: 10})
	if err != nil {
		panic(err)
	}
	for _, m := range out.Messages {
		fmt.Println(aws.ToString(m.Body))
	}
	// Output:
	// sinkbatch: permanent failure MissingMessageGroupId: a FIFO queue needs a Group (MessageGroupId) on every message
	// true <nil>
	// true <nil>
	// true <nil>
	// {"order":1}
	// {"order":2}
	// {"order":3}
}
