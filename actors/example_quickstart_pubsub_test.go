package actors_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// Publish to a Pub/Sub topic from a goroutine. The topic lives on pstest,
// the Pub/Sub fake that ships with Google's client, so this runs anywhere.
func Example() {
	ctx := context.Background()

	// For real Pub/Sub, drop srv and give pubsub.Config only your topic:
	// the codec then dials pubsub.googleapis.com with Application Default
	// Credentials (or $PUBSUB_EMULATOR_HOST when that is set).
	srv := pstest.NewServer()
	defer srv.Close()
	const topic = "projects/my-project/topics/orders"
	if _, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		log.Fatal(err)
	}
	orders, err := pubsub.New(ctx, pubsub.Config{Topic: topic, Endpoint: srv.Addr, Insecure: true})
	if err != nil {
		log.Fatal(err)
	}
	defer orders.Close()

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

	// Deliver returns when this message's own result is known, or at the
	// deadline.
	deliverCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id, err := inst.Deliver(deliverCtx, orders, codec.Message{
		Tenant:         "acme",
		Group:          "order-42", // the ordering key
		IdempotencyKey: "order-42/created",
		Body:           []byte(`{"order":42,"status":"created"}`),
	})
	if err != nil {
		log.Fatal(err) // package messages lists what each error asks of the caller
	}
	fmt.Println("published", id)

	for _, m := range srv.Messages() {
		fmt.Println(m.ID, m.OrderingKey, string(m.Data), m.Attributes[pubsub.DefaultIdempotencyAttribute])
	}
	// Output:
	// published m0
	// m0 order-42 {"order":42,"status":"created"} order-42/created
}
