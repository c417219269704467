package pubsub_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// drawnMessage is a valid message drawn from the shapes Size and Validate
// branch on: no attributes, an empty but non-nil map, empty values, the
// idempotency attribute's name used as an ordinary attribute (no key), the
// user's own trace attributes (which a carried context replaces, tracestate
// included even when the context has none), multi-byte text, and lengths
// around varint boundaries.
func drawnMessage(r *rand.Rand, idemAttr string) codec.Message {
	lengths := []int{0, 1, 2, 127, 128, 129, 300, 1023, 1024}
	pick := func(most int) int { return min(lengths[r.IntN(len(lengths))], most) }
	text := func(n int) string {
		// 4-byte runes, then ASCII: n bytes of valid UTF-8.
		return strings.Repeat("\U0001F600", n/4) + strings.Repeat("z", n%4)
	}
	var m codec.Message
	switch r.IntN(4) {
	case 0:
	case 1:
		m.Body = []byte{}
	default:
		m.Body = []byte(text(pick(1 << 20)))
	}
	switch r.IntN(4) {
	case 0:
		m.Attributes = map[string]string{} // non-nil, empty
	case 1:
		m.Attributes = map[string]string{"e": ""}
	case 2:
		m.Attributes = map[string]string{}
		for i := range 1 + r.IntN(5) {
			m.Attributes[fmt.Sprint("a", i, text(pick(200)))] = text(pick(1024))
		}
	}
	if r.IntN(2) == 0 {
		m.IdempotencyKey = text(1 + pick(1000))
	} else if r.IntN(4) == 0 {
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		m.Attributes[idemAttr] = text(pick(1024)) // an ordinary attribute: no key
	}
	if r.IntN(2) == 0 {
		m.Trace.Parent = "00-" + strings.Repeat("1", 32) + "-" + strings.Repeat("2", 16) + "-01"
		if r.IntN(2) == 0 {
			m.Trace.State = text(1 + pick(1000))
		}
	}
	if r.IntN(3) == 0 {
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		switch r.IntN(3) {
		case 0:
			m.Attributes[pubsub.TraceParentAttribute] = text(pick(1024))
		case 1:
			m.Attributes[pubsub.TraceStateAttribute] = text(pick(1024))
		default:
			m.Attributes[pubsub.TraceParentAttribute] = text(pick(1024))
			m.Attributes[pubsub.TraceStateAttribute] = text(pick(1024))
		}
	}
	return m
}

// Size is what the codec's own SendBatch puts on the wire: the PublishRequest pstest
// receives from it is exactly the topic field plus Σ Size of its messages,
// for every shape drawnMessage draws, with and without trace propagation and
// with a custom idempotency attribute; and a message Validate accepts is
// published, not refused by the codec or the server.
func TestSizeIsWhatSendBatchPutsOnTheWire(t *testing.T) {
	rec := &recorder{}
	srv := newServer(t, rec.option())
	for _, tc := range []struct {
		name      string
		idemAttr  string
		propagate bool
	}{
		{"default", "", true},
		{"no propagation", "", false},
		{"custom idempotency attribute", "dedup", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: srv.Addr, Insecure: true,
				IdempotencyAttribute: tc.idemAttr, DisableTracePropagation: !tc.propagate})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, c.Close()) })
			idemAttr := tc.idemAttr
			if idemAttr == "" {
				idemAttr = pubsub.DefaultIdempotencyAttribute
			}
			topic := pubsub.MaxRequestBytes - c.Limits().MaxBytes
			r := rand.New(rand.NewPCG(4, uint64(len(tc.name))))
			for round := range 60 {
				// One ordering key per request, as Pub/Sub wants it (the
				// codec splits a batch of mixed keys).
				group := ""
				if r.IntN(2) == 0 {
					group = strings.Repeat("\u00e9", r.IntN(512))
				}
				var batch []codec.Message
				sum := 0
				for len(batch) < 1+r.IntN(8) {
					m := drawnMessage(r, idemAttr)
					m.Group = group
					if c.Validate(m) != nil {
						continue
					}
					batch = append(batch, m)
					sum += c.Size(m)
				}
				before := len(rec.requests())
				res, err := c.SendBatch(context.Background(), batch)
				require.NoError(t, err, "round %d", round)
				require.Len(t, res, len(batch))
				for i, r := range res {
					require.NoError(t, r.Err, "round %d: a message Validate accepts is published (message %d)", round, i)
				}
				reqs := rec.requests()
				require.Equal(t, before+1, len(reqs), "one request per SendBatch")
				req := reqs[len(reqs)-1]
				require.Equal(t, topic+sum, proto.Size(req), "round %d: the wire request is the topic field plus Σ Size", round)
				for i, m := range batch {
					assert.Equal(t, c.Size(m), framedSize(req.Messages[i]), "round %d message %d: Size is its own encoded size on the wire", round, i)
				}
			}
		})
	}
}

// framedSize is a published message's size inside its request: its own
// encoding plus the repeated field's tag and length.
func framedSize(p *pubsubpb.PubsubMessage) int {
	return protowire.SizeTag(2) + protowire.SizeBytes(proto.Size(p))
}

// Validate refuses what the limits say, for the attribute shapes the
// table in TestValidate does not hold: faults in the user's own trace attributes (which a
// carried context replaces, yet they are checked as given), faults among
// many good attributes, a map that is non-nil but empty, the trace
// attributes' share of the 100-attribute limit. Each message is refused
// with exactly the code named, whatever order the map iterates in.
func TestValidateRefusesAttributeFaultsByTheLimits(t *testing.T) {
	c, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: "127.0.0.1:1", Insecure: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	noTrace, err := pubsub.New(context.Background(), pubsub.Config{Topic: testTopic, Endpoint: "127.0.0.1:1", Insecure: true, DisableTracePropagation: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, noTrace.Close()) })
	many := func(n int, extra map[string]string) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprint("good", i)] = "v"
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	parent := "00-" + strings.Repeat("1", 32) + "-" + strings.Repeat("2", 16) + "-01"
	body := []byte("b")
	tests := []struct {
		name string
		c    *pubsub.Codec
		m    codec.Message
		code string // "" valid
	}{
		{"non-nil empty map, no body", c, codec.Message{Attributes: map[string]string{}}, "EmptyMessage"},
		{"non-nil empty map, no body, key and trace", c, codec.Message{Attributes: map[string]string{}, IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent}}, "EmptyMessage"},
		{"one empty key among 99 good", c, codec.Message{Body: body, Attributes: many(99, map[string]string{"": "v"})}, "EmptyAttributeKey"},
		{"one long value among 99 good", c, codec.Message{Body: body, Attributes: many(99, map[string]string{"k": strings.Repeat("v", 1025)})}, "AttributeValueTooLong"},
		{"one bad UTF-8 value among 99 good", c, codec.Message{Body: body, Attributes: many(99, map[string]string{"k": "\xc3"})}, "InvalidUTF8"},
		{"user's traceparent with bad UTF-8, carried", c, codec.Message{Body: body, Attributes: map[string]string{pubsub.TraceParentAttribute: "\xff"}, Trace: codec.TraceContext{Parent: parent}}, "InvalidUTF8"},
		{"user's traceparent with bad UTF-8, not carried", noTrace, codec.Message{Body: body, Attributes: map[string]string{pubsub.TraceParentAttribute: "\xff"}, Trace: codec.TraceContext{Parent: parent}}, "InvalidUTF8"},
		{"trace parent with bad UTF-8: the trace is dropped", c, codec.Message{Body: body, Trace: codec.TraceContext{Parent: "\xff"}}, ""},
		{"trace parent with bad UTF-8, not carried", noTrace, codec.Message{Body: body, Trace: codec.TraceContext{Parent: "\xff"}}, ""},
		{"trace state too long: the state is dropped", c, codec.Message{Body: body, Trace: codec.TraceContext{Parent: parent, State: strings.Repeat("s", 1025)}}, ""},
		{"trace state without parent is not carried", c, codec.Message{Body: body, Trace: codec.TraceContext{State: strings.Repeat("s", 1025)}}, ""},
		{"98 attributes, parent and state", c, codec.Message{Body: body, Attributes: many(98, nil), Trace: codec.TraceContext{Parent: parent, State: "s"}}, ""},
		{"99 attributes, parent and state: the state is dropped", c, codec.Message{Body: body, Attributes: many(99, nil), Trace: codec.TraceContext{Parent: parent, State: "s"}}, ""},
		{"100 attributes, parent: the trace is dropped", c, codec.Message{Body: body, Attributes: many(100, nil), Trace: codec.TraceContext{Parent: parent, State: "s"}}, ""},
		{"99 attributes, parent and state, not carried", noTrace, codec.Message{Body: body, Attributes: many(99, nil), Trace: codec.TraceContext{Parent: parent, State: "s"}}, ""},
		{"100 attributes two of them the replaced trace ones", c, codec.Message{Body: body, Attributes: many(98, map[string]string{pubsub.TraceParentAttribute: "p", pubsub.TraceStateAttribute: "s"}), Trace: codec.TraceContext{Parent: parent}}, ""},
		{"99 attributes, key and parent", c, codec.Message{Body: body, Attributes: many(98, nil), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent}}, ""},
		{"99 attributes, key and parent and state: the state is dropped", c, codec.Message{Body: body, Attributes: many(98, nil), IdempotencyKey: "k", Trace: codec.TraceContext{Parent: parent, State: "s"}}, ""},
		{"attributes only, the idempotency name as an ordinary attribute", c, codec.Message{Attributes: map[string]string{pubsub.DefaultIdempotencyAttribute: "v"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 20 { // map iteration order varies from call to call
				err := tt.c.Validate(tt.m)
				if tt.code == "" {
					require.NoError(t, err)
					continue
				}
				var ee *codec.EntryError
				require.ErrorAs(t, err, &ee)
				require.Equal(t, tt.code, ee.Code, "%v", err)
				require.True(t, codec.IsPermanent(err))
			}
		})
	}
}
