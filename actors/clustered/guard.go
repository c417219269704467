package clustered

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// GuardReceive is the option that keeps what a peer sends from killing
// this member's process: pass it to remote.Configure on every member
// (TLSOptions and ReceiveLimit include it). protoactor's remote decodes
// what arrives on the gRPC handler's goroutine without a recover, so an
// envelope naming a type this process does not know, or a target, sender,
// type or serializer index out of range, panics there and ends the
// process; so does a call of one of its unimplemented methods. With the
// option, such a panic ends only the stream (or call) it came on: the peer
// is answered codes.Internal, the panic is logged at WARN through
// slog.Default (the option is made before any actor system and its
// logger), and the member keeps serving every other stream. Messages the
// stream delivered before the bad one stand; those after it on the same
// stream are lost with it, as on any broken connection, and the peer's
// endpoint writer reconnects.
func GuardReceive() remote.ConfigOption {
	return addServerOptions(
		grpc.ChainStreamInterceptor(guardStream),
		grpc.ChainUnaryInterceptor(guardUnary),
	)
}

// guardStream runs a stream's handler, turning a panic into the stream's
// error.
func guardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer guard(info.FullMethod, &err)
	return handler(srv, ss)
}

// guardUnary runs a call's handler, turning a panic into the call's error.
func guardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer guard(info.FullMethod, &err)
	return handler(ctx, req)
}

// guard recovers a handler's panic into *err and logs it.
func guard(method string, err *error) {
	p := recover()
	if p == nil {
		return
	}
	slog.Default().Warn("sinkbatch: a cluster peer's input panicked protoactor's receive path; its stream is dropped and the member keeps serving",
		slog.String("method", method), slog.String("panic", clip(fmt.Sprint(p))))
	*err = status.Error(codes.Internal, "sinkbatch: the message could not be received")
}
