package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/messages"
)

// TestBadInputIsRefusedAtOnce sends, through Instance.Deliver, every input
// the codecs and the batcher must refuse. Each is answered with an error that
// says what is wrong, long before its deadline, with nothing left queued; the
// input-validation cases never reach a server.
func TestBadInputIsRefusedAtOnce(t *testing.T) {
	sqsEnv := newSQSEnv(t, nil, false)
	psEnv := newPubSubEnv(t, nil, false, "projects/chaos/topics/bad")
	stdURL := sqsEnv.createQueue(t, "bad-std", false)
	fifoURL := sqsEnv.createQueue(t, "bad-fifo", true)
	u, err := url.Parse(stdURL)
	require.NoError(t, err)
	u.Path = path.Join(path.Dir(u.Path), "no-such-queue")
	missingURL := u.String()

	std := sqsEnv.codec(t, stdURL, codec.Tuning{})
	fifo := sqsEnv.codec(t, fifoURL, codec.Tuning{})
	missingQueue := sqsEnv.codec(t, missingURL, codec.Tuning{})
	topic := psEnv.codec(t, "projects/chaos/topics/bad", codec.Tuning{})
	smallTopic := psEnv.codec(t, "projects/chaos/topics/bad", codec.Tuning{MaxBytes: 1000})
	missingTopic := psEnv.codec(t, "projects/chaos/topics/missing", codec.Tuning{})
	inst := startQuiet(t, "bad", nil)

	ok := codec.Message{Tenant: "t", Group: "g", IdempotencyKey: "k-1", Body: []byte("a valid body")}
	with := func(edit func(m *codec.Message)) codec.Message {
		m := ok
		m.Attributes = map[string]string{"a": "b"}
		edit(&m)
		return m
	}
	manyAttrs := map[string]string{}
	for i := range 101 {
		manyAttrs[fmt.Sprint("attr-", i)] = "v"
	}
	limits := func(l codec.Limits) *codec.Limits { return &l }
	tuning := func(tu codec.Tuning) *codec.Tuning { return &tu }

	// entryCode checks that err is a permanent *codec.EntryError with code.
	entryCode := func(code string) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var ee *codec.EntryError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, code, ee.Code)
			assert.True(t, ee.Permanent)
			assert.True(t, codec.IsPermanent(err))
			assert.NotEmpty(t, ee.Message, "the error says what is wrong")
		}
	}
	is := func(target error) func(*testing.T, error) {
		return func(t *testing.T, err error) { assert.ErrorIs(t, err, target) }
	}
	says := func(text string) func(*testing.T, error) {
		return func(t *testing.T, err error) { assert.Contains(t, err.Error(), text) }
	}
	tooLarge := func(t *testing.T, err error) {
		assert.ErrorIs(t, err, codec.ErrTooLarge)
		assert.True(t, codec.IsPermanent(err))
	}

	tests := []struct {
		name  string
		c     codec.Codec
		m     codec.Message
		check func(*testing.T, error)
		sends bool // a request is made: the server is what refuses
	}{
		{"sqs oversize", std, with(func(m *codec.Message) { m.Body = []byte(strings.Repeat("x", sqs.MaxBytes+1)) }), tooLarge, false},
		{"pubsub oversize for Tuning.MaxBytes", smallTopic, with(func(m *codec.Message) { m.Body = []byte(strings.Repeat("x", 2000)) }), tooLarge, false},
		{"sqs empty body", std, with(func(m *codec.Message) { m.Body = nil }), entryCode(sqs.CodeEmptyBody), false},
		{"sqs invalid character", std, with(func(m *codec.Message) { m.Body = []byte("bad \x00 body") }), entryCode(sqs.CodeInvalidMessageContent), false},
		{"sqs invalid UTF-8", std, with(func(m *codec.Message) { m.Body = []byte("bad \xff body") }), entryCode(sqs.CodeInvalidMessageContent), false},
		{"sqs too many attributes", std, with(func(m *codec.Message) { m.Attributes = manyAttrs }), entryCode(sqs.CodeTooManyAttributes), false},
		{"pubsub too many attributes", topic, with(func(m *codec.Message) { m.Attributes = manyAttrs }), entryCode("TooManyAttributes"), false},
		{"pubsub attribute key too long", topic, with(func(m *codec.Message) { m.Attributes = map[string]string{strings.Repeat("k", 257): "v"} }), entryCode("AttributeKeyTooLong"), false},
		{"pubsub attribute value too long", topic, with(func(m *codec.Message) { m.Attributes = map[string]string{"k": strings.Repeat("v", 1025)} }), entryCode("AttributeValueTooLong"), false},
		{"pubsub ordering key too long", topic, with(func(m *codec.Message) { m.Group = strings.Repeat("g", 1025) }), entryCode("OrderingKeyTooLong"), false},
		{"pubsub empty message", topic, codec.Message{Tenant: "t", IdempotencyKey: "k"}, entryCode("EmptyMessage"), false},
		{"sqs fifo without group", fifo, with(func(m *codec.Message) { m.Group = "" }), entryCode(sqs.CodeMissingGroup), false},
		{"sqs fifo without idempotency key", fifo, with(func(m *codec.Message) { m.IdempotencyKey = "" }), entryCode(sqs.CodeMissingDeduplication), false},
		{"nil codec", nil, ok, is(messages.ErrNilCodec), false},
		{"zero Limits.MaxEntries", &retuned{realCodec: std, limits: limits(codec.Limits{MaxEntries: 0, MaxBytes: 1 << 20})}, ok, says("Limits().MaxEntries 0 is not positive"), false},
		{"negative Limits.MaxBytes", &retuned{realCodec: std, limits: limits(codec.Limits{MaxEntries: 10, MaxBytes: -1})}, ok, says("Limits().MaxBytes -1 is not in [1, 2 GiB)"), false},
		{"negative Tuning.Linger", &retuned{realCodec: std, tuning: tuning(codec.Tuning{Linger: -time.Second})}, ok, says("Tuning.Linger -1s is negative"), false},
		{"negative Tuning.QueueMax", &retuned{realCodec: topic, tuning: tuning(codec.Tuning{QueueMax: -1})}, ok, says("Tuning.QueueMax -1 is negative"), false},
		{"negative Tuning.IdleTimeout", &retuned{realCodec: topic, tuning: tuning(codec.Tuning{IdleTimeout: -time.Millisecond})}, ok, says("Tuning.IdleTimeout -1ms is negative"), false},
		{"Tuning.MaxEntries above the limit", &retuned{realCodec: std, tuning: tuning(codec.Tuning{MaxEntries: 11})}, ok, says("Tuning.MaxEntries 11 is above the destination's limit 10"), false},
		{"Tuning.MaxBytes above the limit", &retuned{realCodec: std, tuning: tuning(codec.Tuning{MaxBytes: sqs.MaxBytes + 1})}, ok, says(fmt.Sprintf("Tuning.MaxBytes %d is above the destination's limit %d", sqs.MaxBytes+1, sqs.MaxBytes)), false},
		{"wrong number of results", shortCodec{std}, ok, is(codec.ErrResultCount), true},
		{"unknown topic", missingTopic, ok, entryCode("NotFound"), true},
		{"unknown queue", missingQueue, ok, func(t *testing.T, err error) {
			// kumo fails each entry, SQS the whole request: either way
			// permanent, with SQS's code.
			var ee *codec.EntryError
			require.ErrorAs(t, err, &ee)
			assert.True(t, codec.IsPermanent(err), "%v", err)
			assert.Contains(t, []string{"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"}, ee.Code)
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			batches, publishes := sqsEnv.Proxy.Calls(), psEnv.Publishes.Load()
			const timeout = 10 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			id, err := inst.Deliver(ctx, tc.c, tc.m)
			took := time.Since(start)
			require.Error(t, err)
			assert.Empty(t, id)
			assert.False(t, errors.Is(err, context.DeadlineExceeded), "answered, not timed out: %v", err)
			tc.check(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch"), "the error names its source: %v", err)
			// Typically under 25 ms; the bound only tells an answer from a
			// wait for the deadline on a loaded machine.
			assert.Less(t, took, timeout/2, "answered at once, not at the deadline")
			// The counters are the actor's to publish: a request goroutine
			// that took the batch for its slot answers before the actor
			// has seen it go.
			assert.Eventually(t, func() bool { return inst.Stats().Queued == 0 }, 5*time.Second, time.Millisecond, "nothing stays queued")
			if !tc.sends {
				assert.Equal(t, batches, sqsEnv.Proxy.Calls(), "no SendMessageBatch was made")
				assert.Equal(t, publishes, psEnv.Publishes.Load(), "no Publish was made")
			}
			t.Logf("%v: %v", took.Round(time.Millisecond), err)
		})
	}

	// The servers hold only what the cases that send made.
	assert.Empty(t, psEnv.readBack("projects/chaos/topics/bad"), "no message reached the topic")
	assert.Empty(t, sqsEnv.readBack(t, fifoURL), "no message reached the FIFO queue")
	got := sqsEnv.readBack(t, stdURL)
	if assert.Len(t, got, 1, "only the wrong-result-count case reached the standard queue") {
		assert.Equal(t, string(ok.Body), got[0].Body)
	}
}
