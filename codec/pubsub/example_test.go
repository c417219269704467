package pubsub_test

import (
	"context"
	"fmt"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// A codec for a topic on pstest. In production leave Insecure unset and pass
// CredentialsJSON (or nothing, for Application Default Credentials); hand
// the codec to sinkbatch's Instance.Deliver rather than calling SendBatch.
func ExampleNew() {
	srv := pstest.NewServer()
	defer srv.Close()
	ctx := context.Background()
	if _, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p/topics/orders"}); err != nil {
		panic(err)
	}

	c, err := pubsub.New(ctx, pubsub.Config{
		Topic:    "projects/p/topics/orders",
		Endpoint: srv.Addr,
		Insecure: true,
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	res, err := c.SendBatch(ctx, []codec.Message{
		{Group: "customer-7", IdempotencyKey: "order-1", Body: []byte("created")},
		{Group: "customer-7", IdempotencyKey: "order-1/paid", Body: []byte("paid")},
	})
	if err != nil {
		panic(err)
	}
	for i, m := range srv.Messages() {
		fmt.Println(res[i].ID == m.ID, m.OrderingKey, string(m.Data), m.Attributes["idempotency-key"])
	}
	fmt.Println(c.Limits())
	// Output:
	// true customer-7 created order-1
	// true customer-7 paid order-1/paid
	// {1000 9999974 true}
}
