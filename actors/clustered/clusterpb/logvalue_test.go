package clusterpb

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLogsKeepThePayloadOut(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	req := &DeliverRequest{Group: "g", Body: []byte("secret card number")}
	log.Debug("routing", slog.Any("message", req))
	log.Debug("routing", slog.Any("message", &DeliverBatch{Destination: "orders", Requests: []*DeliverRequest{req, req}}))
	assert.NotContains(t, buf.String(), "secret")
	assert.Contains(t, buf.String(), "orders")
	assert.Contains(t, buf.String(), "bytes=18")
	assert.Contains(t, buf.String(), "deliveries=2")
	assert.Contains(t, buf.String(), "bytes=36")
}
