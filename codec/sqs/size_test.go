package sqs_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// traceModes are the trace propagation modes, by name.
var traceModes = []struct {
	name string
	mode sqs.TracePropagation
}{
	{"off", sqs.TraceOff},
	{"w3c", sqs.TraceW3CAttributes},
	{"header", sqs.TraceAWSHeader},
	{"both", sqs.TraceBoth},
}

// sizedMessage is a valid message with the parts Size adds up: attributes
// (none, a non-nil empty map, several with multi-byte values),
// an idempotency key, a trace context (valid, or one the codec does not
// carry), the caller's own traceparent.
func sizedMessage(r *rand.Rand, i int) codec.Message {
	m := codec.Message{Body: []byte(fmt.Sprintf("m%d-%s", i, strings.Repeat("é", r.IntN(40))))}
	switch r.IntN(3) {
	case 0:
		m.Attributes = map[string]string{}
	case 1:
		m.Attributes = map[string]string{}
		for j := range 1 + r.IntN(4) {
			m.Attributes[fmt.Sprintf("a%d.x-y_z", j)] = strings.Repeat("ß", r.IntN(30)) + "v"
		}
	}
	if r.IntN(2) == 0 {
		m.IdempotencyKey = fmt.Sprintf("key-%d-%d", i, r.Int())
	}
	switch r.IntN(4) {
	case 0, 1:
		m.Trace = codec.TraceContext{Parent: sampledParent, State: "vendor=" + strings.Repeat("x", r.IntN(20))}
	case 2:
		m.Trace = codec.TraceContext{Parent: "not a traceparent"}
	}
	if r.IntN(6) == 0 {
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		m.Attributes[sqs.TraceParentAttribute] = unsampledParent
	}
	return m
}

// Size is what SQS counts toward its 1 MiB per request (fauxqs counts as
// SQS does: body, and each message attribute's name, data type and value;
// a system attribute, the AWSTraceHeader, not at all): a batch whose Σ Size
// is exactly sqs.MaxBytes is accepted, and one byte more is refused as
// BatchRequestTooLong, for messages with and without attributes,
// idempotency keys and trace contexts. In the modes that carry the
// AWSTraceHeader, Size counts it although SQS does not (package doc,
// Tracing): there the request SQS refuses is 84 bytes a message further
// than Σ Size, and the test checks that much.
func TestSizeIsWhatSQSCounts(t *testing.T) {
	e := newFauxqs(t)
	q := e.createQueue(t, false, false)
	header := len(sqs.AWSTraceHeader) + len("String") + len(sampledHeader)
	for _, md := range traceModes {
		t.Run(md.name, func(t *testing.T) {
			c := e.codec(t, q, codec.Tuning{}, func(c *sqs.Config) { c.TracePropagation = md.mode })
			r := rand.New(rand.NewPCG(7, uint64(md.mode)))
			for round := range 6 {
				n := 1 + r.IntN(sqs.MaxEntries)
				batch := make([]codec.Message, n)
				sum, uncounted := 0, 0
				for i := range batch {
					batch[i] = sizedMessage(r, round*100+i)
					require.NoError(t, c.Validate(batch[i]))
					if (md.mode == sqs.TraceAWSHeader || md.mode == sqs.TraceBoth) && batch[i].Trace.Parent == sampledParent {
						uncounted += header
					}
				}
				// Pad the last body so that the batch weighs exactly
				// MaxBytes by Size.
				for i := range batch[:n-1] {
					sum += c.Size(batch[i])
				}
				last := &batch[n-1]
				last.Body = append(last.Body, bytes.Repeat([]byte("p"), sqs.MaxBytes-sum-c.Size(*last))...)
				sum += c.Size(*last)
				require.Equal(t, sqs.MaxBytes, sum)

				res, err := c.SendBatch(ctx(t), batch)
				require.NoError(t, err, "round %d: a batch of Σ Size = MaxBytes is accepted", round)
				for i, r := range res {
					require.NoError(t, r.Err, "round %d message %d", round, i)
				}

				// What SQS counts beyond Σ Size: refused one byte past it.
				last.Body = append(last.Body, bytes.Repeat([]byte("q"), uncounted+1)...)
				// Unvalidated: the server's verdict, not the codec's
				// (Validate refuses a single message over MaxBytes).
				_, err = sqs.SendUnvalidated(ctx(t), c, batch)
				require.Error(t, err, "round %d: a batch SQS counts as MaxBytes+1 is refused", round)
				assert.True(t, errors.Is(err, codec.ErrRefused), "round %d: %v", round, err)
				assert.Contains(t, err.Error(), "BatchRequestTooLong")
				if uncounted > 0 {
					// One byte less and SQS takes it: what it counts is
					// Σ Size less the AWSTraceHeaders.
					last.Body = last.Body[:len(last.Body)-1]
					res, err := sqs.SendUnvalidated(ctx(t), c, batch)
					require.NoError(t, err, "round %d: SQS does not count the AWSTraceHeader", round)
					for i, r := range res {
						require.NoError(t, r.Err, "round %d message %d", round, i)
					}
				}
			}
		})
	}
	e.drain(t, q)
}
