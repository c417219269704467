package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// The package doc (Tracing) said: "A trace context never costs a message its
// delivery". That holds for the AWSTraceHeader, which the codec leaves out
// when it would take a message past a limit; it does not hold for the W3C
// attributes of TraceW3CAttributes and TraceBoth, which SQS counts like the
// caller's own: a message that a batcher takes and SQS stores without its
// trace context (10 attributes; exactly Tuning.MaxBytes) is refused, at
// once and for good, with it. The doc now says so; this pins it.
func TestAdv5W3CTraceAttributesCostAMessageAtALimitItsDelivery(t *testing.T) {
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
	// TestAdv4TraceNeverCostsAMessageItsDelivery): the same two messages go.
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
