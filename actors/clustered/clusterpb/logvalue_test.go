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
	log.Debug("routing", slog.Any("message", &DeliverRequest{Destination: "orders", Message: &Message{Group: "g", Body: []byte("secret card number")}}))
	assert.NotContains(t, buf.String(), "secret")
	assert.Contains(t, buf.String(), "orders")
	assert.Contains(t, buf.String(), "bytes=18")
}
