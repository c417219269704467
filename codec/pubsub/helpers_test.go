package pubsub_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

const testTopic = "projects/p/topics/top"

// reactor adapts a function to pstest.Reactor. It runs under the server's
// lock: it must not call back into the server.
type reactor func(req *pubsubpb.PublishRequest) (handled bool, ret any, err error)

func (f reactor) React(r any) (bool, any, error) {
	return f(r.(*pubsubpb.PublishRequest))
}

// recorder is a Publish reactor that counts calls, keeps each request's
// proto.Size and ordering keys, and lets a test-supplied fail decide the
// answer.
type recorder struct {
	calls atomic.Int64
	mu    sync.Mutex
	reqs  []*pubsubpb.PublishRequest
	fail  func(n int64, req *pubsubpb.PublishRequest) error
}

func (r *recorder) option() pstest.ServerReactorOption {
	return pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(func(req *pubsubpb.PublishRequest) (bool, any, error) {
		n := r.calls.Add(1)
		r.mu.Lock()
		r.reqs = append(r.reqs, proto.Clone(req).(*pubsubpb.PublishRequest))
		r.mu.Unlock()
		if r.fail != nil {
			if err := r.fail(n, req); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})}
}

// refusePoison is a recorder's fail that refuses, as Pub/Sub refuses an
// invalid message, every request holding a message whose data is "poison".
func refusePoison(_ int64, req *pubsubpb.PublishRequest) error {
	for _, m := range req.Messages {
		if string(m.Data) == "poison" {
			return status.Error(codes.InvalidArgument, "poison")
		}
	}
	return nil
}

func (r *recorder) requests() []*pubsubpb.PublishRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pubsubpb.PublishRequest(nil), r.reqs...)
}

// newServer starts a pstest server with testTopic and the given reactors.
func newServer(t testing.TB, opts ...pstest.ServerReactorOption) *pstest.Server {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: testTopic})
	require.NoError(t, err)
	return srv
}

// newBigServer serves srv's fake on a gRPC server that receives up to
// 16 MiB, as the real service does for 10 MB requests, and returns its
// address.
func newBigServer(t testing.TB, srv *pstest.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
	pubsubpb.RegisterPublisherServer(g, &srv.GServer)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

// newCodec returns a codec for topic on addr, closed at clean-up.
func newCodec(t testing.TB, addr, topic string, tuning codec.Tuning) *pubsub.Codec {
	t.Helper()
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: topic, Endpoint: addr, Insecure: true, Tuning: tuning})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func msg(i int) codec.Message {
	return codec.Message{Body: []byte(fmt.Sprintf("body %d", i))}
}

// newAPIClient dials a plain TopicAdminClient to addr.
func newAPIClient(addr string) (*apiv1.TopicAdminClient, error) {
	return apiv1.NewTopicAdminClient(context.Background(),
		option.WithEndpoint(addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
}

// wireCall is what a server saw of one Publish call on the wire.
type wireCall struct {
	compression string // the grpc-encoding the client sent; "" or "identity" is none
	length      int    // the request's serialized size
	wire        int    // its size on the wire: compressed payload and gRPC framing
}

// wireStats is a server-side stats.Handler that records every call's
// compression and sizes.
type wireStats struct {
	mu    sync.Mutex
	calls []wireCall
}

type wireKey struct{}

func (w *wireStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, wireKey{}, &wireCall{})
}

func (w *wireStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	call := ctx.Value(wireKey{}).(*wireCall)
	switch s := s.(type) {
	case *stats.InHeader:
		call.compression = s.Compression
	case *stats.InPayload:
		// Recorded here, not at End: the server decodes the request (and
		// reports it) before its handler answers, so the call is recorded
		// before the client has its answer.
		call.length, call.wire = s.Length, s.WireLength
		w.mu.Lock()
		w.calls = append(w.calls, *call)
		w.mu.Unlock()
	}
}

func (w *wireStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (w *wireStats) HandleConn(context.Context, stats.ConnStats)                       {}

func (w *wireStats) take() []wireCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	calls := w.calls
	w.calls = nil
	return calls
}

// newWireServer serves srv's fake on a gRPC server that records each call's
// compression and sizes, and returns its address.
func newWireServer(t testing.TB, srv *pstest.Server) (string, *wireStats) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	w := &wireStats{}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(16<<20), grpc.StatsHandler(w))
	pubsubpb.RegisterPublisherServer(g, &srv.GServer)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String(), w
}
