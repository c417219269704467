package clustered

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// overTheWire is err as a caller on another member gets it: encoded,
// marshalled, unmarshalled, decoded.
func overTheWire(t *testing.T, err error) error {
	t.Helper()
	b, merr := proto.Marshal(&clusterpb.DeliverReply{Error: encodeError(err)})
	require.NoError(t, merr)
	var r clusterpb.DeliverReply
	require.NoError(t, proto.Unmarshal(b, &r))
	return decodeError(r.Error)
}

// TestErrorsKeepTheirMeaningAcrossTheWire: every answer a local delivery
// can get is, after the wire, the same to errors.Is, errors.As (with the
// same fields), codec.IsPermanent, codec.IsThrottled, and reads the same.
func TestErrorsKeepTheirMeaningAcrossTheWire(t *testing.T) {
	cases := map[string]error{
		"retry after":         &messages.RetryAfterError{After: 370 * time.Millisecond, Reason: messages.FullTenant},
		"stopped":             messages.ErrStopped,
		"batcher down":        fmt.Errorf("sinkbatch: request: %w", messages.ErrBatcherDown),
		"nil codec":           messages.ErrNilCodec,
		"not deliver":         messages.ErrNotDeliver,
		"nil context":         actors.ErrNilContext,
		"group paused":        &messages.GroupPausedError{Group: "g1", Key: "k7", After: 250 * time.Millisecond},
		"deadline":            fmt.Errorf("sinkbatch: queued past its deadline: %w", context.DeadlineExceeded),
		"canceled":            context.Canceled,
		"too large":           fmt.Errorf("%w: 2000000 bytes", codec.ErrTooLarge),
		"refused":             fmt.Errorf("%w: bad body", codec.ErrRefused),
		"codec panic send":    fmt.Errorf("%w: boom", codec.ErrCodecPanic),
		"codec panic size":    fmt.Errorf("%w: %w", codec.ErrCodecPanic, &codec.EntryError{Code: "Panic", Permanent: true}),
		"result count":        fmt.Errorf("%w: 3 for 4", codec.ErrResultCount),
		"throttled":           fmt.Errorf("%w: slow down", codec.ErrThrottled),
		"entry permanent":     &codec.EntryError{Code: "InvalidMessageContents", Message: "bad char", Permanent: true},
		"entry throttled":     &codec.EntryError{Code: "RequestThrottled", Throttled: true},
		"entry retryable":     &codec.EntryError{Code: "InternalError", Message: "try again"},
		"unknown destination": fmt.Errorf("%w %q", ErrUnknownDestination, "nope"),
		"unreachable":         fmt.Errorf("%w: %w", ErrUnreachable, context.DeadlineExceeded),
		"plain":               errors.New("sinkbatch: something else"),
	}
	for name, orig := range cases {
		t.Run(name, func(t *testing.T) {
			got := overTheWire(t, orig)
			require.Error(t, got)
			assert.Equal(t, orig.Error(), got.Error())
			assert.Equal(t, codec.IsPermanent(orig), codec.IsPermanent(got), "IsPermanent")
			assert.Equal(t, codec.IsThrottled(orig), codec.IsThrottled(got), "IsThrottled")
			for _, s := range sentinels {
				assert.Equal(t, errors.Is(orig, s.err), errors.Is(got, s.err), "errors.Is %v", s.err)
			}
			var ra1, ra2 *messages.RetryAfterError
			if assert.Equal(t, errors.As(orig, &ra1), errors.As(got, &ra2)) && ra1 != nil {
				assert.Equal(t, *ra1, *ra2)
			}
			var ee1, ee2 *codec.EntryError
			if assert.Equal(t, errors.As(orig, &ee1), errors.As(got, &ee2)) && ee1 != nil {
				assert.Equal(t, *ee1, *ee2)
			}
			var gp1, gp2 *messages.GroupPausedError
			if assert.Equal(t, errors.As(orig, &gp1), errors.As(got, &gp2)) && gp1 != nil {
				assert.Equal(t, *gp1, *gp2)
			}
		})
	}
	assert.NoError(t, overTheWire(t, nil))
}

// TestEveryDocumentedSentinelTravels: each error value the README's table
// (and this package) tells callers to test with errors.Is has a wire form
// of its own.
func TestEveryDocumentedSentinelTravels(t *testing.T) {
	documented := []error{
		messages.ErrStopped, messages.ErrBatcherDown, messages.ErrNilCodec, messages.ErrNotDeliver,
		actors.ErrNilContext, context.DeadlineExceeded, context.Canceled,
		codec.ErrTooLarge, codec.ErrRefused, codec.ErrCodecPanic, codec.ErrResultCount, codec.ErrThrottled,
		ErrUnknownDestination, ErrUnreachable,
	}
	wire := map[clusterpb.Sentinel]bool{}
	for _, s := range sentinels {
		assert.False(t, wire[s.wire], "%v is used twice", s.wire)
		wire[s.wire] = true
		assert.NotEqual(t, clusterpb.Sentinel_SENTINEL_UNSPECIFIED, s.wire)
	}
	for _, want := range documented {
		got := overTheWire(t, fmt.Errorf("wrapped: %w", want))
		assert.ErrorIs(t, got, want)
		for _, other := range documented {
			if other != want && !errors.Is(want, other) {
				assert.NotErrorIs(t, got, other, "%v came back as %v too", want, other)
			}
		}
	}
}

// TestMessageRoundTrip: every field of a message crosses the wire.
func TestMessageRoundTrip(t *testing.T) {
	m := codec.Message{
		Tenant: "t", Group: "g", IdempotencyKey: "k", Body: []byte("body"),
		Attributes: map[string]string{"a": "1", "b": "2"},
		Trace:      codec.TraceContext{Parent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", State: "x=y"},
	}
	var r clusterpb.DeliverRequest
	toWire(&r, m)
	b, err := proto.Marshal(&r)
	require.NoError(t, err)
	var w clusterpb.DeliverRequest
	require.NoError(t, proto.Unmarshal(b, &w))
	assert.Equal(t, m, fromWire(&w))
}

// wireSize and replySize are upper bounds of what a delivery and an answer
// take in their batch messages, which the budgets of boxes rely on: tried
// with every field at its widest encoding (lengths of 2 and 3 bytes, a
// negative budget, the largest call number, a full parent span).
func TestWireSizesBoundTheEncoding(t *testing.T) {
	long := strings.Repeat("s", 300)
	huge := make([]byte, 3<<20)
	span := &clusterpb.SpanContext{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Flags: math.MaxUint32, State: long}
	attrs := map[string]string{}
	for i := range 100 {
		attrs[fmt.Sprint(long, i)] = long
	}
	for _, q := range []queuedDelivery{
		{},
		{call: math.MaxUint32, deadline: time.Now().Add(-time.Hour), parent: span, message: codec.Message{
			Tenant: long, Group: long, IdempotencyKey: long, Body: huge,
			Trace: codec.TraceContext{Parent: long, State: long},
		}},
		{call: 1, deadline: time.Now().Add(time.Hour), message: codec.Message{Body: huge, Attributes: attrs}},
		{call: 1, deadline: time.Now().Add(time.Hour), message: codec.Message{Body: []byte("x"), Attributes: map[string]string{"": ""}}},
	} {
		r := &clusterpb.DeliverRequest{BudgetNanos: int64(time.Until(q.deadline)), Call: q.call, Parent: q.parent}
		toWire(r, q.message)
		encoded := proto.Size(&clusterpb.DeliverBatch{Requests: []*clusterpb.DeliverRequest{r}})
		assert.LessOrEqual(t, encoded, wireSize(q), "a delivery of %d body bytes", len(q.message.Body))
	}
	for _, r := range []*clusterpb.DeliverReply{
		{},
		{Call: math.MaxUint32, NotOwner: true, Id: long, Sequence: long},
		{Call: math.MaxUint32, Id: long, Error: encodeError(&codec.EntryError{Code: string(huge), Message: string(huge)})},
		{Call: 1, Error: encodeError(&messages.RetryAfterError{After: time.Hour, Reason: messages.FullBytes})},
	} {
		encoded := proto.Size(&clusterpb.DeliverReplies{Replies: []*clusterpb.DeliverReply{r}})
		assert.LessOrEqual(t, encoded, replySize(r))
	}
}

// A paused group travels in a hand-off with every retry it waits for, in
// order: the new owner admits them in the same order, not only the first.
func TestAHandedOffPauseKeepsTheRetriesItWaitsFor(t *testing.T) {
	pg := &clusterpb.PausedGroup{Group: "g", Key: "a", Then: []string{"b", "c"}, LeftNanos: int64(time.Second)}
	b, err := proto.Marshal(&clusterpb.HandoffDone{Destination: "d", Member: "m", Paused: []*clusterpb.PausedGroup{pg}})
	require.NoError(t, err)
	var done clusterpb.HandoffDone
	require.NoError(t, proto.Unmarshal(b, &done))
	assert.Equal(t, []messages.PausedGroup{{Group: "g", Key: "a", Then: []string{"b", "c"}, Left: time.Second}}, pausesFromWire(done.Paused))
}
