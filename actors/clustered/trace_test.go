//go:build !race

package clustered_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ankusa/sinkbatch/codec"
)

// TestCallersSpanCrossesTheWire: the create span the owner's batcher starts
// for a delivery is a child of the span in the Deliver caller's ctx, whether
// the caller is on another member or on the owner itself.
func TestCallersSpanCrossesTheWire(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ms := startTestCluster(t, 2, []string{"traced"}, memberOpts{tracer: tp})
	owner, other := ownerOf(t, ms, "traced")

	// The callers' spans come from a provider of their own: only the owner's
	// instance records.
	callers := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = callers.Shutdown(context.Background()) })
	for _, m := range []*member{other, owner} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ctx, parent := callers.Tracer("test").Start(ctx, "dispatch")
		id, err := m.node.Deliver(ctx, "traced", codec.Message{Body: []byte("traced from " + m.system.Address())})
		parent.End()
		cancel()
		require.NoError(t, err)

		var create sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			for _, kv := range s.Attributes() {
				if kv.Key == "messaging.message.id" && kv.Value.AsString() == id {
					create = s
				}
			}
		}
		require.NotNil(t, create, "no create span for the delivery from %s", m.system.Address())
		assert.True(t, strings.HasPrefix(create.Name(), "create "), create.Name())
		assert.Equal(t, parent.SpanContext().TraceID(), create.SpanContext().TraceID(), "the create span is in the caller's trace")
		assert.Equal(t, parent.SpanContext().SpanID(), create.Parent().SpanID(), "the create span is a child of the caller's span")
		assert.Equal(t, m == other, create.Parent().IsRemote(), "the parent is remote when the caller is on another member")
	}
}
