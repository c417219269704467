package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/messages"
)

// Relay rows from goroutines, as an outbox relay does: each row is retried
// until it is published or its error is permanent, and then parked.
func ExampleInstance_Deliver_retry() {
	ctx := context.Background()
	srv := pstest.NewServer()
	defer srv.Close()
	const topic = "projects/my-project/topics/orders"
	if _, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		log.Fatal(err)
	}
	// A small queue, so that a burst of rows can meet RetryAfterError.
	orders, err := pubsub.New(ctx, pubsub.Config{Topic: topic, Endpoint: srv.Addr, Insecure: true,
		Tuning: codec.Tuning{QueueMax: 8, MaxInflight: 1, RetryAfterMax: 50 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	defer orders.Close()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Stop(context.Background())

	rows := make([]codec.Message, 40)
	for i := range rows {
		key := fmt.Sprintf("row-%02d", i)
		rows[i] = codec.Message{Tenant: "acme", IdempotencyKey: key, Body: []byte(key)}
	}
	rows[7].Attributes = map[string]string{"": "no key"} // Pub/Sub refuses it for good

	var mu sync.Mutex
	var published, parked []string
	var wg sync.WaitGroup
	for _, row := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := deliver(ctx, inst, orders, row)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				parked = append(parked, fmt.Sprintf("%s: %v", row.IdempotencyKey, codec.IsPermanent(err)))
				return
			}
			published = append(published, row.IdempotencyKey)
		}()
	}
	wg.Wait()
	sort.Strings(parked)
	fmt.Println("published:", len(published), "stored:", len(srv.Messages()))
	fmt.Println("parked (permanent):", parked)
	// Output:
	// published: 39 stored: 39
	// parked (permanent): [row-07: true]
}

// failurePause is the wait after a retryable error that states none.
const failurePause = 100 * time.Millisecond

// deliver sends row until it is published, its error is permanent, or ctx
// ends. Each attempt has a deadline of its own; every retry carries the
// same idempotency key, so a consumer can drop a duplicate.
func deliver(ctx context.Context, inst *actors.Instance, dest codec.Codec, row codec.Message) (string, error) {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		id, err := inst.Deliver(attempt, dest, row)
		cancel()
		if err == nil || codec.IsPermanent(err) {
			return id, err // published, or park the row: resending cannot help
		}
		wait := failurePause
		var full *messages.RetryAfterError
		var paused *messages.GroupPausedError
		switch {
		case errors.As(err, &full):
			wait = full.After // the queue was full: nothing was queued
		case errors.As(err, &paused) && paused.After > 0:
			wait = paused.After // the group waits for an earlier message's retry
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(wait):
		}
	}
}
