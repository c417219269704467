package pubsub_test

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/codectest"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// harness runs the conformance suite on pstest: each MakeCodec creates a
// fresh topic on one server.
type harness struct {
	srv   *pstest.Server
	n     int
	topic string
}

func (h *harness) MakeCodec(t *testing.T, tuning codec.Tuning) codec.Codec {
	h.n++
	h.topic = fmt.Sprintf("projects/p/topics/conformance-%d", h.n)
	_, err := h.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: h.topic})
	require.NoError(t, err)
	return newCodec(t, h.srv.Addr, h.topic, tuning)
}

func (h *harness) Retune(t *testing.T, c codec.Codec, tuning codec.Tuning) codec.Codec {
	return newCodec(t, h.srv.Addr, c.(*pubsub.Codec).Topic(), tuning)
}

func (h *harness) Received(*testing.T) []codectest.Received {
	var got []codectest.Received
	for _, m := range h.srv.Messages() {
		if m.Topic != h.topic {
			continue
		}
		attrs := maps.Clone(m.Attributes)
		key := attrs[pubsub.DefaultIdempotencyAttribute]
		delete(attrs, pubsub.DefaultIdempotencyAttribute)
		got = append(got, codectest.Received{
			ID:             m.ID,
			Body:           m.Data,
			Attributes:     attrs,
			Group:          m.OrderingKey,
			IdempotencyKey: key,
		})
	}
	return got
}

func TestConformance(t *testing.T) {
	codectest.Run(t, &harness{srv: newServer(t)})
}
