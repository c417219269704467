package messages_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

func TestFullReasonString(t *testing.T) {
	assert.Equal(t, "entries", messages.FullEntries.String())
	assert.Equal(t, "bytes", messages.FullBytes.String())
	assert.Equal(t, "tenant", messages.FullTenant.String())
	assert.Equal(t, "FullReason(7)", messages.FullReason(7).String())
}

func TestRetryAfterError(t *testing.T) {
	var err error = fmt.Errorf("deliver: %w", &messages.RetryAfterError{After: 250 * time.Millisecond, Reason: messages.FullTenant})
	var ra *messages.RetryAfterError
	assert.True(t, errors.As(err, &ra))
	assert.Equal(t, 250*time.Millisecond, ra.After)
	assert.Equal(t, "deliver: sinkbatch: queue full (tenant), retry after 250ms", err.Error())
	assert.False(t, codec.IsPermanent(err), "a full queue is worth another try")
}

// secretCodec is a codec whose fields must never reach a log.
type secretCodec struct{ secret string }

func (c *secretCodec) Name() string           { return "sqs" }
func (c *secretCodec) Identity() []byte       { return []byte(c.secret) }
func (c *secretCodec) Limits() codec.Limits   { return codec.Limits{MaxEntries: 1, MaxBytes: 1} }
func (c *secretCodec) Tuning() codec.Tuning   { return codec.Tuning{} }
func (c *secretCodec) Size(codec.Message) int { return 0 }
func (c *secretCodec) SendBatch(context.Context, []codec.Message) ([]codec.Result, error) {
	return nil, nil
}

func TestDeliverLogsWithoutItsCodecOrPayload(t *testing.T) {
	d := &messages.Deliver{
		Codec:   &secretCodec{secret: "TOPSECRET"},
		Message: codec.Message{Tenant: "acme", Group: "g", Body: []byte("PAYLOAD"), Attributes: map[string]string{"k": "ATTRIBUTE"}},
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("dead letter", slog.Any("message", d))
	for _, text := range []string{b.String(), fmt.Sprint(d), fmt.Sprintf("%v %+v", d, d)} {
		assert.Contains(t, text, "sink=sqs")
		assert.Contains(t, text, "tenant=acme")
		for _, hidden := range []string{"TOPSECRET", "PAYLOAD", "ATTRIBUTE"} {
			assert.NotContains(t, text, hidden)
		}
	}
}
