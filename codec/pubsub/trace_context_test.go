package pubsub_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// A trace context never costs a message its delivery: a tracestate Pub/Sub
// would refuse (AttributeValueTooLong on googclient_tracestate) is dropped
// and the message published with its traceparent; a message with no
// attribute left for the trace is published without it. Each is counted.
func TestATraceContextPubSubCannotTakeIsDroppedNotTheMessage(t *testing.T) {
	srv := newServer(t)
	c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	many := map[string]string{}
	for i := range pubsub.MaxAttributes {
		many[strings.Repeat("a", i+1)] = "v"
	}
	batch := []codec.Message{
		{Body: []byte("long state"), Trace: codec.TraceContext{Parent: parent, State: strings.Repeat("s", pubsub.MaxAttributeValueBytes+1)}},
		{Body: []byte("no room"), Attributes: many, Trace: codec.TraceContext{Parent: parent}},
		{Body: []byte("fits"), Trace: codec.TraceContext{Parent: parent, State: "k=v"}},
	}
	for _, m := range batch {
		require.NoError(t, c.Validate(m), "%s", m.Body)
	}
	res, err := c.SendBatch(context.Background(), batch)
	require.NoError(t, err)
	for i, r := range res {
		require.NoError(t, r.Err, "%s", batch[i].Body)
	}
	got := srv.Messages()
	require.Len(t, got, 3)
	byBody := map[string]map[string]string{}
	for _, m := range got {
		byBody[string(m.Data)] = m.Attributes
	}
	assert.Equal(t, parent, byBody["long state"][pubsub.TraceParentAttribute])
	assert.NotContains(t, byBody["long state"], pubsub.TraceStateAttribute)
	assert.NotContains(t, byBody["no room"], pubsub.TraceParentAttribute)
	assert.Len(t, byBody["no room"], pubsub.MaxAttributes)
	assert.Equal(t, "k=v", byBody["fits"][pubsub.TraceStateAttribute])
	assert.Equal(t, uint64(2), c.TraceContextsDropped())
}
