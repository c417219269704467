package codec_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/codec"
)

func TestIsPermanent(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"permanent entry", &codec.EntryError{Code: "InvalidMessageContents", Permanent: true}, true},
		{"retryable entry", &codec.EntryError{Code: "ServiceUnavailable"}, false},
		{"wrapped permanent entry", fmt.Errorf("send: %w", &codec.EntryError{Code: "QueueDoesNotExist", Permanent: true}), true},
		{"refused", fmt.Errorf("InvalidArgument: %w", codec.ErrRefused), true},
		{"too large", fmt.Errorf("%w: 11 bytes", codec.ErrTooLarge), true},
		{"a retryable entry error wins over the refusal it wraps", &wrapping{&codec.EntryError{Code: "Throttling"}, codec.ErrRefused}, false},
		{"deadline", context.DeadlineExceeded, false},
		{"codec panic", fmt.Errorf("%w: boom", codec.ErrCodecPanic), false},
		{"anything else", errors.New("connection reset"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, codec.IsPermanent(tc.err))
		})
	}
}

// wrapping wraps two errors.
type wrapping struct{ a, b error }

func (w *wrapping) Error() string   { return w.a.Error() + ": " + w.b.Error() }
func (w *wrapping) Unwrap() []error { return []error{w.a, w.b} }

func TestEntryErrorText(t *testing.T) {
	assert.Equal(t, "sinkbatch: permanent failure InvalidMessageContents: bad char",
		(&codec.EntryError{Code: "InvalidMessageContents", Message: "bad char", Permanent: true}).Error())
	assert.Equal(t, "sinkbatch: retryable failure Throttling", (&codec.EntryError{Code: "Throttling"}).Error())
}
