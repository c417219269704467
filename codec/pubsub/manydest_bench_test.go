package pubsub_test

import (
	"context"
	"fmt"
	"testing"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/internal/manybench"
)

// manyShape is BenchmarkManyDestinations' set-up.
var manyShape = manybench.Shape{Destinations: 1024, Callers: 2048, Rounds: 4, Body: benchBody, Probe: benchDelay}

// BenchmarkManyDestinations compares, in one run on one pstest server with
// 1024 topics, sinkbatch with this codec (one codec per topic, all sharing
// one TopicAdminClient; 1000 messages, Linger 5ms) against the Pub/Sub
// client's own batching publisher (one Publisher per topic on one Client;
// CountThreshold 1000, DelayThreshold 5ms), as a relay that spreads its
// traffic over a topic per customer would use them. 2048 callers each wait
// for their message's id before sending the next; caller c sends its k-th
// message to topic (c+k) mod 1024, so each caller moves on to another topic
// after each message. Each iteration publishes one message through each
// side, in 4 rounds a side that alternate (see manybench.Run, which says
// what it reports). A pstest reactor counts the Publish requests.
func BenchmarkManyDestinations(b *testing.B) {
	count := manybench.NewCounter()
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(func(req *pubsubpb.PublishRequest) (bool, any, error) {
		bodies := make([][]byte, len(req.Messages))
		for i, m := range req.Messages {
			bodies[i] = m.Data
		}
		count.Request(bodies)
		return false, nil, nil
	})})
	b.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()
	topics := make([]string, manyShape.Destinations)
	for i := range topics {
		topics[i] = fmt.Sprintf("projects/p/topics/tenant-%04d", i)
		_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topics[i]})
		require.NoError(b, err)
	}

	client, err := gpubsub.NewClient(ctx, "p",
		option.WithEndpoint(srv.Addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, client.Close()) })
	pubs := make([]*gpubsub.Publisher, len(topics))
	for i, t := range topics {
		p := client.Publisher(t)
		p.PublishSettings.CountThreshold = benchMaxCount
		p.PublishSettings.DelayThreshold = benchDelay
		p.PublishSettings.ByteThreshold = 9_000_000 // not the binding threshold, as for sinkbatch
		pubs[i] = p
	}
	b.Cleanup(func() {
		for _, p := range pubs {
			p.Stop()
		}
	})

	shared, err := newAPIClient(srv.Addr)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, shared.Close()) })
	codecs := make([]*pubsub.Codec, len(topics))
	for i, t := range topics {
		codecs[i], err = pubsub.New(ctx, pubsub.Config{Topic: t, Client: shared, IdentityExtra: []byte("shared"),
			Tuning: codec.Tuning{MaxEntries: benchMaxCount, Linger: benchDelay}})
		require.NoError(b, err)
	}
	inst := startInstance(b)

	tenants := make([]string, manyShape.Callers) // made once, so that no side pays for formatting them
	for i := range tenants {
		tenants[i] = fmt.Sprint("t", i%8)
	}
	google := &manybench.Side{Name: "google", Send: func(_, topic int, body []byte) (string, error) {
		return pubs[topic].Publish(ctx, &gpubsub.Message{Data: body}).Get(ctx)
	}}
	sinkbatch := &manybench.Side{Name: "sinkbatch", Send: func(caller, topic int, body []byte) (string, error) {
		return inst.Deliver(ctx, codecs[topic], codec.Message{Tenant: tenants[caller], Body: body})
	}}
	manybench.Run(b, manyShape, count, srv.ClearMessages, sinkbatch, google)
}
