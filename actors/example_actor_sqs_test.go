package actors_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
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

// The relay of ExampleInstance_PID, sending to an SQS queue on kumo: the
// actor is the same whatever the codec.
func ExampleInstance_PID_sqs() {
	ctx := context.Background()
	srv := kumo.NewServer()
	defer srv.Close()
	awsCfg := aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(srv.URL),
	}
	client := awssqs.NewFromConfig(awsCfg)
	created, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String("audit")})
	if err != nil {
		log.Fatal(err)
	}
	queueURL := aws.ToString(created.QueueUrl)
	// A queue of 4 entries, so that most of the burst below is refused
	// with a retry-after of at most 20ms.
	audit, err := sqs.New(sqs.Config{
		QueueURL: queueURL, AWS: awsCfg,
		Tuning: codec.Tuning{QueueMax: 4, RetryAfterMax: 20 * time.Millisecond},
		// kumo leaves out the attribute checksum Amazon SQS sends.
		AttributeChecksumsOptional: true,
	})
	if err != nil {
		log.Fatal(err)
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Stop(context.Background())

	const rows = 20
	settled := make(chan Settled, rows)
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &relay{inst: inst, dest: audit, settled: settled}
	}))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()

	for i := range rows {
		system.Root.Send(pid, &Row{ID: fmt.Sprintf("row-%02d", i), Tenant: "acme", Body: fmt.Appendf(nil, "event %d", i)})
	}
	delivered := 0
	for range rows {
		if s := <-settled; s.Err != nil {
			fmt.Println(s.Row.ID, "failed:", s.Err)
			continue
		}
		delivered++
	}
	fmt.Println(delivered, "of", rows, "rows delivered")

	// Read the queue until it is empty; sort the keys, as a standard
	// queue keeps no order.
	var keys []string
	for {
		got, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl:              aws.String(queueURL),
			MaxNumberOfMessages:   10,
			MessageAttributeNames: []string{sqs.DefaultIdempotencyAttribute},
		})
		if err != nil {
			log.Fatal(err)
		}
		if len(got.Messages) == 0 {
			break
		}
		for _, m := range got.Messages {
			keys = append(keys, aws.ToString(m.MessageAttributes[sqs.DefaultIdempotencyAttribute].StringValue))
		}
	}
	slices.Sort(keys)
	fmt.Println(strings.Join(keys, " "))
	// Output:
	// 20 of 20 rows delivered
	// row-00 row-01 row-02 row-03 row-04 row-05 row-06 row-07 row-08 row-09 row-10 row-11 row-12 row-13 row-14 row-15 row-16 row-17 row-18 row-19
}
