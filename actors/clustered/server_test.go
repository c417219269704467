package clustered_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// watched is a pstest Pub/Sub server behind a gRPC server of its own that
// counts, per ordering key, a Publish arriving while another Publish of the
// same key is still being served: two requests of one group in flight. Each
// Publish takes latency, as a real service's round trip does, so that
// requests overlap when the cluster lets them.
type watched struct {
	srv     *pstest.Server
	addr    string
	latency time.Duration

	mu       sync.Mutex
	running  map[string]int
	overlaps atomic.Int64
	requests atomic.Int64
}

const testProject = "projects/sinkbatch-test"

func newWatched(t testing.TB, latency time.Duration, topics ...string) *watched {
	t.Helper()
	w := &watched{srv: pstest.NewServer(), latency: latency, running: map[string]int{}}
	for _, topic := range topics {
		_, err := w.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: testProject + "/topics/" + topic})
		require.NoError(t, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.UnaryInterceptor(w.intercept))
	pubsubpb.RegisterPublisherServer(g, &w.srv.GServer)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	w.addr = lis.Addr().String()
	t.Cleanup(func() {
		g.Stop()
		<-done
		_ = w.srv.Close()
	})
	return w
}

func (w *watched) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	p, ok := req.(*pubsubpb.PublishRequest)
	if !ok {
		return handler(ctx, req)
	}
	w.requests.Add(1)
	keys := map[string]bool{}
	for _, m := range p.Messages {
		if m.OrderingKey != "" {
			keys[p.Topic+"/"+m.OrderingKey] = true
		}
	}
	w.mu.Lock()
	for k := range keys {
		if w.running[k] > 0 {
			w.overlaps.Add(1)
		}
		w.running[k]++
	}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		for k := range keys {
			if w.running[k]--; w.running[k] == 0 {
				delete(w.running, k)
			}
		}
		w.mu.Unlock()
	}()
	// The server's own latency, not a wait for an outcome.
	timer := time.NewTimer(w.latency)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return handler(ctx, req)
}

// codecFor returns a member's codec factory: a Pub/Sub codec per topic,
// dialling w, closed when the test ends.
func (w *watched) codecFor(t testing.TB, tuning codec.Tuning) func(string) codec.Codec {
	return func(name string) codec.Codec {
		c, err := pubsub.New(context.Background(), pubsub.Config{
			Topic:    testProject + "/topics/" + name,
			Endpoint: w.addr,
			Insecure: true,
			Tuning:   tuning,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
}
