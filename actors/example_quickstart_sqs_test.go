package actors_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
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

// Send to an SQS FIFO queue from a goroutine. The queue lives on kumo, an
// SQS emulator that runs in-process, so this runs anywhere.
func Example_sqs() {
	ctx := context.Background()

	// For real SQS, drop srv and the queue's creation: load the AWS
	// config with config.LoadDefaultConfig(ctx) (the default credential
	// chain) and give sqs.Config your queue's URL.
	srv := kumo.NewServer()
	defer srv.Close()
	awsCfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(srv.URL),
	}
	client := awssqs.NewFromConfig(awsCfg)
	created, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName:  aws.String("orders.fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		log.Fatal(err)
	}
	queueURL := aws.ToString(created.QueueUrl)
	orders, err := sqs.New(sqs.Config{QueueURL: queueURL, AWS: awsCfg,
		// kumo leaves out the attribute checksum Amazon SQS sends; drop
		// this line against the real service.
		AttributeChecksumsOptional: true})
	if err != nil {
		log.Fatal(err)
	}

	// protoactor logs in colour at INFO by default; this keeps warnings
	// and errors only, as plain text on stderr.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Stop(context.Background()) // sends what is queued, answers every caller

	// DeliverResult is Deliver with the sequence number a FIFO queue
	// assigns. It returns when this message's own result is known, or at
	// the deadline.
	deliverCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := inst.DeliverResult(deliverCtx, orders, codec.Message{
		Tenant:         "acme",
		Group:          "order-42",         // the MessageGroupId
		IdempotencyKey: "order-42/created", // the MessageDeduplicationId
		Body:           []byte(`{"order":42,"status":"created"}`),
	})
	if err != nil {
		log.Fatal(err) // package messages lists what each error asks of the caller
	}
	fmt.Println("sent; sequence number assigned:", res.Sequence != "")

	got, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
		QueueUrl:              aws.String(queueURL),
		MaxNumberOfMessages:   10,
		MessageAttributeNames: []string{"All"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range got.Messages {
		key := m.MessageAttributes[sqs.DefaultIdempotencyAttribute].StringValue
		fmt.Println(aws.ToString(m.MessageId) == res.ID, aws.ToString(m.Body), aws.ToString(key))
	}
	// Output:
	// sent; sequence number assigned: true
	// true {"order":42,"status":"created"} order-42/created
}
