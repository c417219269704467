package sqs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/sqstest"
)

const (
	sampledParent   = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
	sampledHeader   = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	unsampledParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	unsampledHeader = "Root=1-0af76519-16cd43dd8448eb211c80319c;Parent=b7ad6b7169203331;Sampled=0"
)

func TestXRayHeader(t *testing.T) {
	assert.Equal(t, sampledHeader, sqs.XRayHeader(sampledParent))
	assert.Equal(t, unsampledHeader, sqs.XRayHeader(unsampledParent))
	assert.Equal(t, "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
		sqs.XRayHeader("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-03"), "only the sampled bit counts")
	for s, ok := range map[string]bool{
		sampledParent: true,
		"01-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01-future": true,
		"00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01-x":      false,
		"ff-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01":        false,
		"00-00000000000000000000000000000000-53995c3f42cd8ad8-01":        false,
		"00-5759e988bd862e3fe1be46a994272793-0000000000000000-01":        false,
		"00-5759E988BD862E3FE1BE46A994272793-53995c3f42cd8ad8-01":        false,
		"00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8":           false,
		"garbage": false,
		"":        false,
	} {
		assert.Equal(t, ok, sqs.ValidTraceparent(s), s)
	}
}

// TestTraceSizeAndValidate: what the codec carries counts in Size, and W3C
// attributes in the attribute limit; the AWSTraceHeader costs no attribute.
func TestTraceSizeAndValidate(t *testing.T) {
	withMode := func(p sqs.TracePropagation) *sqs.Codec {
		cfg := baseConfig()
		cfg.TracePropagation = p
		return mustNew(t, cfg)
	}
	header, w3c, both, off := withMode(sqs.TraceAWSHeader), withMode(sqs.TraceW3CAttributes), withMode(sqs.TraceBoth), withMode(sqs.TraceOff)
	assert.Equal(t, header.Identity(), mustNew(t, baseConfig()).Identity(), "TraceAWSHeader is the default")
	assert.NotEqual(t, header.Identity(), w3c.Identity())

	m := codec.Message{Body: []byte("hello"), Trace: codec.TraceContext{Parent: sampledParent, State: "vendor=x"}}
	headerSize := len("AWSTraceHeader") + len("String") + len(sampledHeader)
	parentSize := len("traceparent") + len("String") + len(sampledParent)
	stateSize := len("tracestate") + len("String") + len("vendor=x")
	assert.Equal(t, 5+headerSize, header.Size(m))
	assert.Equal(t, 5+parentSize+stateSize, w3c.Size(m))
	assert.Equal(t, 5+headerSize+parentSize+stateSize, both.Size(m))
	assert.Equal(t, 5, off.Size(m))
	noState := m
	noState.Trace.State = ""
	assert.Equal(t, 5+parentSize, w3c.Size(noState), "an empty tracestate is not carried")
	bad := m
	bad.Trace.Parent = "not a traceparent"
	for _, c := range []*sqs.Codec{header, w3c, both} {
		assert.Equal(t, 5, c.Size(bad), "an invalid traceparent is not carried")
		require.NoError(t, c.Validate(bad))
	}

	nine := codec.Message{Body: []byte("x"), IdempotencyKey: "k", Attributes: map[string]string{}, Trace: m.Trace}
	for i := range 9 {
		nine.Attributes[string(rune('a'+i))] = "v"
	}
	require.NoError(t, header.Validate(nine), "the AWSTraceHeader costs none of the 10 attributes")
	require.NoError(t, off.Validate(nine))
	err := w3c.Validate(nine)
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, sqs.CodeTooManyAttributes, ee.Code)
	assert.Contains(t, ee.Message, "12 message attributes (the idempotency key and the W3C trace context count)")

	// The caller's own traceparent wins, and counts once.
	own := codec.Message{Body: []byte("hello"), Attributes: map[string]string{"traceparent": unsampledParent}, Trace: m.Trace}
	assert.Equal(t, 5+parentSize-len(sampledParent)+len(unsampledParent), w3c.Size(own))

	cfg := baseConfig()
	cfg.TracePropagation = 9
	_, err = sqs.New(cfg)
	require.ErrorContains(t, err, "Config.TracePropagation TracePropagation(9)")
	cfg.TracePropagation = sqs.TraceW3CAttributes
	cfg.IdempotencyAttribute = "traceparent"
	_, err = sqs.New(cfg)
	require.ErrorContains(t, err, "Config.IdempotencyAttribute \"traceparent\"")
	assert.Equal(t, "TraceBoth", sqs.TraceBoth.String())
}

// wire records the entries of every SendMessageBatch request.
type wire struct {
	mu      sync.Mutex
	entries []types.SendMessageBatchRequestEntry
}

// record is a proxy Fault that reads the request and lets it through.
func (w *wire) record(c *sqstest.Call) sqstest.Action {
	var in struct {
		Entries []types.SendMessageBatchRequestEntry
	}
	if err := json.Unmarshal(c.Body, &in); err != nil {
		panic(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.entries = append(w.entries, in.Entries...)
	return sqstest.Action{}
}

// TestTracePropagation sends traced messages with each propagation and
// checks the request on the wire and what each server gives back.
func TestTracePropagation(t *testing.T) {
	for _, srv := range []struct {
		name string
		mk   func(testing.TB) *env
	}{{"kumo", newKumo}, {"fauxqs", newFauxqs}} {
		t.Run(srv.name, func(t *testing.T) {
			e := srv.mk(t)
			p := sqstest.New(t, e.endpoint)
			for _, mode := range []sqs.TracePropagation{sqs.TraceAWSHeader, sqs.TraceW3CAttributes, sqs.TraceBoth, sqs.TraceOff} {
				t.Run(mode.String(), func(t *testing.T) {
					w := &wire{}
					p.Set(w.record)
					q := e.createQueue(t, false, false)
					c := e.codec(t, q, codec.Tuning{}, func(c *sqs.Config) {
						c.AWS.BaseEndpoint = aws.String(p.URL)
						c.TracePropagation = mode
					})
					batch := []codec.Message{
						{Body: []byte("sampled"), IdempotencyKey: "k1", Trace: codec.TraceContext{Parent: sampledParent, State: "vendor=x,other=y"}},
						{Body: []byte("unsampled"), Trace: codec.TraceContext{Parent: unsampledParent}},
						{Body: []byte("untraced")},
					}
					res, err := c.SendBatch(ctx(t), batch)
					require.NoError(t, err)
					for _, r := range res {
						require.NoError(t, r.Err)
					}
					header := map[string]string{"sampled": sampledHeader, "unsampled": unsampledHeader}
					parent := map[string]string{"sampled": sampledParent, "unsampled": unsampledParent}
					state := map[string]string{"sampled": "vendor=x,other=y"}
					withHeader := mode == sqs.TraceAWSHeader || mode == sqs.TraceBoth
					withAttrs := mode == sqs.TraceW3CAttributes || mode == sqs.TraceBoth

					w.mu.Lock()
					require.Len(t, w.entries, 3)
					for _, en := range w.entries {
						body := aws.ToString(en.MessageBody)
						got := en.MessageSystemAttributes[sqs.AWSTraceHeader]
						if withHeader && header[body] != "" {
							assert.Equal(t, header[body], aws.ToString(got.StringValue), body)
							assert.Equal(t, "String", aws.ToString(got.DataType))
						} else {
							assert.Empty(t, en.MessageSystemAttributes, body)
						}
					}
					w.mu.Unlock()

					got := e.readBackTraced(t, q, 3)
					returned := false
					for _, m := range got {
						body := m.body
						if withAttrs {
							assert.Equal(t, parent[body], m.attrs["traceparent"], body)
							assert.Equal(t, state[body], m.attrs["tracestate"], body)
						} else {
							assert.NotContains(t, m.attrs, "traceparent", body)
							assert.NotContains(t, m.attrs, "tracestate", body)
						}
						returned = returned || m.header != ""
						switch {
						case m.header == "":
						case withHeader:
							assert.Equal(t, header[body], m.header, body)
						default:
							t.Errorf("%s: AWSTraceHeader %q, want none", body, m.header)
						}
					}
					if withHeader && !returned {
						t.Logf("%s stores no AWSTraceHeader: checked on the wire only", e.kind)
					}
				})
			}
		})
	}
}

// traced is a received message's body, message attributes and
// AWSTraceHeader.
type traced struct {
	body   string
	attrs  map[string]string
	header string
}

// readBackTraced receives n messages from queueURL, asking for the
// AWSTraceHeader system attribute.
func (e *env) readBackTraced(t *testing.T, queueURL string, n int) []traced {
	t.Helper()
	var all []traced
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		out, err := e.admin.ReceiveMessage(ctx(t), &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(queueURL),
			MaxNumberOfMessages:         10,
			VisibilityTimeout:           30,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAWSTraceHeader},
		})
		require.NoError(t, err)
		for _, m := range out.Messages {
			if seen[aws.ToString(m.MessageId)] {
				continue
			}
			seen[aws.ToString(m.MessageId)] = true
			r := traced{body: aws.ToString(m.Body), attrs: map[string]string{}, header: m.Attributes[string(types.MessageSystemAttributeNameAWSTraceHeader)]}
			for k, v := range m.MessageAttributes {
				r.attrs[k] = aws.ToString(v.StringValue)
			}
			all = append(all, r)
		}
		return len(all) >= n
	}, 10*time.Second, 20*time.Millisecond)
	return all
}

// TestTraceHeaderChecksum: SQS's MD5OfMessageSystemAttributes is checked
// when it is there, and not required (neither kumo nor fauxqs sends it).
func TestTraceHeaderChecksum(t *testing.T) {
	f := newFaultEnv(t, false)
	right := sqs.AttributesMD5(map[string]types.MessageAttributeValue{
		sqs.AWSTraceHeader: {DataType: aws.String("String"), StringValue: aws.String(sampledHeader)},
	})
	f.proxy.Set(sqstest.Rewrite(func(a *sqstest.BatchAnswer) {
		for _, e := range a.Successful {
			switch entryIndex(e) {
			case 0:
				e["MD5OfMessageSystemAttributes"] = right
			case 1:
				e["MD5OfMessageSystemAttributes"] = "0123456789abcdef0123456789abcdef"
			}
		}
	}))
	traced := codec.Message{Body: []byte("traced"), Trace: codec.TraceContext{Parent: sampledParent}}
	res, err := f.codec.SendBatch(ctx(t), []codec.Message{traced, traced, traced})
	require.NoError(t, err)
	// Entry 2 has no checksum: a missing one is not required.
	ee := onlyEntryFailed(t, res, 1)
	assert.Equal(t, sqs.CodeChecksumMismatch, ee.Code)
	assert.Contains(t, ee.Message, "MD5OfMessageSystemAttributes")
}

// The sqs package doc (Tracing) promises: "A trace context never costs a
// message its delivery". In the default mode the context travels in the
// AWSTraceHeader, a system attribute SQS does not count toward a message's
// size: a message that SQS takes without its trace context (here exactly
// MaxMessageBytes of body, or Tuning.MaxBytes when that is tighter) must
// pass Validate with it too, and be taken by a batcher and stored (kumo);
// the codec may leave the header out, but must not refuse the message. (The W3C attributes count toward SQS's size and attribute
// limits, and TraceW3CAttributes says so: a message they take over a limit
// is refused, as TestTraceSizeAndValidate pins.)
func TestTraceNeverCostsAMessageItsDelivery(t *testing.T) {
	e := newKumo(t)
	q := e.createQueue(t, false, false)
	for _, tc := range []struct {
		name  string
		tight int // Tuning.MaxBytes; 0: SQS's
	}{{"MaxMessageBytes", 0}, {"Tuning.MaxBytes", 4096}} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.codec(t, q, codec.Tuning{MaxBytes: tc.tight})
			limit := c.MaxMessageBytes()
			if tc.tight > 0 {
				limit = tc.tight
			}
			plain := codec.Message{Body: bytes.Repeat([]byte("x"), limit-len("idem")-len("String")-3), IdempotencyKey: "k-1"}
			require.Equal(t, limit, c.Size(plain))
			require.NoError(t, c.Validate(plain), "the message without a trace context")
			traced := plain
			traced.Trace = codec.TraceContext{Parent: sampledParent}
			require.NoError(t, c.Validate(traced), "the same message with a trace context is refused: the trace context cost it its delivery")
			assert.LessOrEqual(t, c.Size(traced), limit, "what Size counts fits the limit the batcher enforces")

			// Through a batcher (the instance does not trace; the
			// message carries its context as a traced one would).
			inst := startInstance(t)
			dctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
			defer cancel()
			_, err := inst.Deliver(dctx, c, traced)
			require.NoError(t, err, "a batcher takes the traced message")

			// Room left: the header is carried, and SQS stores it.
			small := codec.Message{Body: []byte("small"), Trace: codec.TraceContext{Parent: sampledParent}}
			require.Equal(t, 5+len(sqs.AWSTraceHeader)+len("String")+len(sampledHeader), c.Size(small), "a message with room carries the header")
		})
	}
	e.drain(t, q)
}

// The package doc (Tracing) said: "A trace context never costs a message its
// delivery". That holds for the AWSTraceHeader, which the codec leaves out
// when it would take a message past a limit; it does not hold for the W3C
// attributes of TraceW3CAttributes and TraceBoth, which SQS counts like the
// caller's own: a message that a batcher takes and SQS stores without its
// trace context (10 attributes; exactly Tuning.MaxBytes) is refused, at
// once and for good, with it. The doc now says so; this pins it.
func TestW3CTraceAttributesCostAMessageAtALimitItsDelivery(t *testing.T) {
	e := newKumo(t)
	q := e.createQueue(t, false, false)
	inst := startInstance(t)
	const tight = 4096
	deliver := func(c *sqs.Codec, m codec.Message) error {
		dctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
		defer cancel()
		_, err := inst.Deliver(dctx, c, m)
		return err
	}
	tenAttributes := func(body string) codec.Message {
		m := codec.Message{Body: []byte(body), IdempotencyKey: "k-" + body, Attributes: map[string]string{}}
		for i := range 9 { // and the idempotency key: SQS's 10
			m.Attributes[fmt.Sprintf("a%d", i)] = "v"
		}
		return m
	}
	full := codec.Message{Body: bytes.Repeat([]byte("x"), tight-len("idem")-len("String")-len("k-1")), IdempotencyKey: "k-1"}
	for _, mode := range []sqs.TracePropagation{sqs.TraceW3CAttributes, sqs.TraceBoth} {
		t.Run(mode.String(), func(t *testing.T) {
			c := e.codec(t, q, codec.Tuning{MaxBytes: tight}, func(cfg *sqs.Config) { cfg.TracePropagation = mode })
			require.Equal(t, tight, c.Size(full))

			plain := tenAttributes("plain-" + mode.String())
			require.NoError(t, c.Validate(plain))
			require.NoError(t, deliver(c, plain), "without a trace context SQS takes the message")
			require.NoError(t, deliver(c, full), "without a trace context SQS takes the message")

			traced := tenAttributes("traced-" + mode.String())
			traced.Trace = codec.TraceContext{Parent: sampledParent}
			err := deliver(c, traced)
			var ee *codec.EntryError
			require.ErrorAs(t, err, &ee, "the traceparent attribute is the 11th")
			assert.Equal(t, sqs.CodeTooManyAttributes, ee.Code)
			assert.True(t, codec.IsPermanent(err), "%v", err)

			tracedFull := full
			tracedFull.Trace = codec.TraceContext{Parent: sampledParent}
			assert.Greater(t, c.Size(tracedFull), tight)
			err = deliver(c, tracedFull)
			assert.True(t, errors.Is(err, codec.ErrTooLarge), "%v", err)
		})
	}
	// The AWSTraceHeader alone never costs a delivery (see
	// TestTraceNeverCostsAMessageItsDelivery): the same two messages go.
	c := e.codec(t, q, codec.Tuning{MaxBytes: tight})
	traced := tenAttributes("traced-header")
	traced.Trace = codec.TraceContext{Parent: sampledParent}
	require.NoError(t, deliver(c, traced))
	tracedFull := full
	tracedFull.IdempotencyKey = "k-2"
	tracedFull.Trace = codec.TraceContext{Parent: sampledParent}
	require.NoError(t, deliver(c, tracedFull))
	e.drain(t, q)
}
