package codec_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
		{"result count", fmt.Errorf("%w: 1 for 2", codec.ErrResultCount), false},
		{"marked permanent", permanentMark{}, true},
		{"throttled entry", &codec.EntryError{Code: "Throttling", Throttled: true}, false},
		{"Permanent over a retryable entry", codec.Permanent(&codec.EntryError{Code: "InvalidParameterValue"}), true},
		{"Permanent over a wrapped retryable entry", codec.Permanent(fmt.Errorf("sqs: %w", &codec.EntryError{Code: "X"})), true},
		{"a refusal wrapping the destination's code", fmt.Errorf("%w: %w", codec.ErrRefused, &codec.EntryError{Code: "InvalidArgument"}), true},
		{"a wrapped retryable entry before a permanent marker", fmt.Errorf("%w: %w", &codec.EntryError{Code: "Throttling"}, codec.Permanent(errors.New("x"))), false},
		{"anything else", errors.New("connection reset"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, codec.IsPermanent(tc.err))
		})
	}
}

// permanentMark is an error that says it is permanent, as messages.ErrNilCodec does.
type permanentMark struct{}

func (permanentMark) Error() string          { return "marked" }
func (permanentMark) PermanentFailure() bool { return true }

func TestIsThrottled(t *testing.T) {
	assert.True(t, codec.IsThrottled(&codec.EntryError{Code: "Throttling", Throttled: true}))
	assert.True(t, codec.IsThrottled(fmt.Errorf("send: %w", &codec.EntryError{Code: "Throttling", Throttled: true})))
	assert.True(t, codec.IsThrottled(fmt.Errorf("%w: 429", codec.ErrThrottled)))
	assert.False(t, codec.IsThrottled(&codec.EntryError{Code: "ServiceUnavailable"}))
	assert.False(t, codec.IsThrottled(nil))
}

func TestTuningCheckNamesTheField(t *testing.T) {
	lim := codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}
	tests := []struct {
		tuning codec.Tuning
		want   string
	}{
		{codec.Tuning{}, ""},
		{codec.Tuning{MaxEntries: 11}, "sinkbatch: Tuning.MaxEntries 11 is above the destination's limit 10"},
		{codec.Tuning{Linger: -1}, "sinkbatch: Tuning.Linger -1ns is negative"},
		{codec.Tuning{GroupPauseMax: -time.Second}, "sinkbatch: Tuning.GroupPauseMax -1s is negative"},
		{codec.Tuning{WhenFull: 7}, "sinkbatch: Tuning.WhenFull FullPolicy(7) is not Refuse or Block"},
		{codec.Tuning{QueueMaxBytes: 100, MaxBytes: 1000}, "sinkbatch: Tuning.QueueMaxBytes 100 is below Tuning.MaxBytes 1000: a full request could never be queued"},
		{codec.Tuning{QueueMaxBytes: 100}, "sinkbatch: Tuning.QueueMaxBytes 100 is below the destination's request limit 1048576: set Tuning.MaxBytes to it or below"},
		{codec.Tuning{QueueMaxBytes: 100, MaxBytes: 100}, ""},
	}
	for _, tc := range tests {
		err := tc.tuning.Check(lim)
		if tc.want == "" {
			assert.NoError(t, err, "%+v", tc.tuning)
		} else {
			assert.EqualError(t, err, tc.want)
		}
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
