// Package pubsubtest serves pstest, the Pub/Sub fake that ships with the
// client library, for sinkbatch's tests on a gRPC server of the test's own
// on 127.0.0.1, so that a test can put interceptors (delays, counts) in
// front of it and fail Publish calls with a reactor.
package pubsubtest

import (
	"context"
	"net"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// Reactor is a function of one Publish request that pstest can run as a
// reactor: handled true answers the call with ret and err, false lets the
// fake publish. It runs under the fake's lock and must not call back into
// the server.
type Reactor func(req *pubsubpb.PublishRequest) (handled bool, ret any, err error)

// React implements pstest.Reactor.
func (f Reactor) React(r any) (bool, any, error) { return f(r.(*pubsubpb.PublishRequest)) }

// Serve starts pstest with react, if not nil, as its Publish reactor,
// creates topics (full names, "projects/p/topics/t"), and serves the fake's
// publisher on a new gRPC server made with opts. It returns the fake and
// the gRPC server's address; when tb ends, the gRPC server stops and then
// the fake.
func Serve(tb testing.TB, react Reactor, topics []string, opts ...grpc.ServerOption) (*pstest.Server, string) {
	tb.Helper()
	var srvOpts []pstest.ServerReactorOption
	if react != nil {
		srvOpts = append(srvOpts, pstest.ServerReactorOption{FuncName: "Publish", Reactor: react})
	}
	srv := pstest.NewServerWithAddress("127.0.0.1:0", srvOpts...)
	tb.Cleanup(func() { _ = srv.Close() })
	for _, name := range topics {
		_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: name})
		require.NoError(tb, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	g := grpc.NewServer(opts...)
	pubsubpb.RegisterPublisherServer(g, &srv.GServer)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	tb.Cleanup(func() { g.Stop(); <-done })
	return srv, lis.Addr().String()
}
