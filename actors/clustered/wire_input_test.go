package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
)

// TestMalformedWireInputDropsOnlyItsStream sends a member, over
// protoactor's own gRPC service, envelopes that panic protoactor's receive
// path (an unknown type name; a type, target, sender or serializer index
// out of range) and calls its unimplemented methods. With GuardReceive
// (which ReceiveLimit includes) each ends only its own stream or call, and
// the member keeps serving deliveries and new streams; without it the
// first one ends the process.
func TestMalformedWireInputDropsOnlyItsStream(t *testing.T) {
	ms := startTestCluster(t, 1, []string{"d"}, memberOpts{remote: []remote.ConfigOption{clustered.ReceiveLimit(8 << 20)}})
	m := ms[0]
	deliver := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := m.node.Deliver(ctx, "d", codec.Message{Body: []byte("x")})
		require.NoError(t, err)
	}
	deliver()

	conn, err := grpc.NewClient(m.system.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := remote.NewRemotingClient(conn)
	for name, batch := range malformedBatches(m.system.Address()) {
		t.Run(name, func(t *testing.T) {
			sendOnAStream(t, client, batch)
			deliver()
		})
	}
	t.Run("unimplemented method", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.ListProcesses(ctx, &remote.ListProcessesRequest{})
		require.Equal(t, codes.Internal, status.Code(err), "%v", err)
		deliver()
	})
}

// malformedBatches are message batches, to the node's endpoint at
// address, that panic protoactor's receive path (an unknown type name; a
// type, target, sender or serializer index out of range) or that do not
// decode.
func malformedBatches(address string) map[string]*remote.MessageBatch {
	target := actor.NewPID(address, "sinkbatch-clustered")
	data, typeName := []byte{}, "sinkbatch.clustered.v1.DeliverReplies"
	return map[string]*remote.MessageBatch{
		"unknown type name": {TypeNames: []string{"no.such.Type"}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{MessageData: data}}},
		"type id out of range": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{TypeId: 7, MessageData: data}}},
		"negative type id": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{TypeId: -1, MessageData: data}}},
		"target out of range": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{Target: 3, MessageData: data}}},
		"no targets": {TypeNames: []string{typeName},
			Envelopes: []*remote.MessageEnvelope{{MessageData: data}}},
		"sender out of range": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{Sender: 5, MessageData: data}}},
		"serializer id out of range": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{SerializerId: 9, MessageData: data}}},
		"undecodable body": {TypeNames: []string{typeName}, Targets: []*actor.PID{target},
			Envelopes: []*remote.MessageEnvelope{{MessageData: []byte{0xff, 0xff, 0xff}}}},
	}
}

// sendOnAStream opens a stream to client's member as a stranger would,
// sends batch on it and waits for the member to end the stream (with an
// error), as it must for a malformed batch.
func sendOnAStream(t *testing.T, client remote.RemotingClient, batch *remote.MessageBatch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{
		ConnectRequest: &remote.ConnectRequest{ConnectionType: &remote.ConnectRequest_ServerConnection{
			ServerConnection: &remote.ServerConnection{SystemId: "stranger", Address: "127.0.0.1:1"}}}}}))
	_, err = stream.Recv()
	require.NoError(t, err, "the connect response")
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: batch}}))
	for err == nil {
		_, err = stream.Recv()
	}
}
