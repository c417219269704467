package codectest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
)

// Harness gives Run codecs for fresh destinations and reads back what they
// hold. Its methods are called from Run's goroutine and its subtests, one at
// a time.
type Harness interface {
	// MakeCodec returns a codec with the given tuning for a fresh, empty
	// destination (a new queue or topic). Later calls of Received report that
	// destination. Clean-up belongs in t.Cleanup.
	MakeCodec(t *testing.T, tuning codec.Tuning) codec.Codec
	// Retune returns a codec for the same destination as c, which MakeCodec
	// made, that differs from c only in its tuning.
	Retune(t *testing.T, c codec.Codec, tuning codec.Tuning) codec.Codec
	// Received returns every message the latest MakeCodec's destination has
	// received so far, in arrival order, including those an earlier call
	// returned. It must not block waiting for messages: Run polls it.
	Received(t *testing.T) []Received
}

// Received is one message as the destination holds it.
type Received struct {
	// ID is the id the destination assigned; it must equal the Result.ID
	// SendBatch answered.
	ID string
	// Body is the message's payload.
	Body []byte
	// Attributes are the user's attributes, without any the codec adds for
	// its own use (such as one carrying the idempotency key).
	Attributes map[string]string
	// Group is the ordering group the destination reports (an SQS
	// MessageGroupId, a Pub/Sub ordering key).
	Group string
	// IdempotencyKey is the idempotency key as the destination or the
	// codec's attribute carries it.
	IdempotencyKey string
}

// Field names a field of Received.
type Field int

// The fields of Received a destination may not report on read back.
const (
	FieldGroup Field = iota + 1
	FieldIdempotencyKey
	// FieldOrder is the arrival order within a group: a destination that
	// does not promise it (an SQS standard queue) reports it as Unreported
	// and Run skips the order check.
	FieldOrder
)

// String is the field's name in Received.
func (f Field) String() string {
	switch f {
	case FieldGroup:
		return "Group"
	case FieldIdempotencyKey:
		return "IdempotencyKey"
	case FieldOrder:
		return "Order"
	}
	return fmt.Sprintf("Field(%d)", int(f))
}

// Unreported is implemented by a Harness whose destination does not report
// some fields of a stored message on read back. Run skips comparing them.
type Unreported interface {
	Unreported() []Field
}

// ReadBackTimeout bounds how long Run waits for sent messages to read back.
const ReadBackTimeout = 10 * time.Second

// Run runs the conformance suite against the codecs h makes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	skip := map[Field]bool{}
	if u, ok := h.(Unreported); ok {
		for _, f := range u.Unreported() {
			skip[f] = true
		}
	}

	t.Run("NameAndIdentity", func(t *testing.T) { testNameAndIdentity(t, h) })
	t.Run("LimitsAndTuning", func(t *testing.T) { testLimitsAndTuning(t, h) })
	t.Run("Size", func(t *testing.T) { testSize(t, h) })
	t.Run("SendBatchFull", func(t *testing.T) { testSendBatchFull(t, h, skip) })
	t.Run("GroupOrder", func(t *testing.T) {
		if skip[FieldOrder] {
			t.Skip("the destination does not keep order within a group")
		}
		testGroupOrder(t, h)
	})
	t.Run("CancelledContext", func(t *testing.T) { testCancelledContext(t, h) })
	t.Run("Validate", func(t *testing.T) { testValidate(t, h) })
}

func testNameAndIdentity(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	name := c.Name()
	require.NotEmpty(t, name)
	assert.Equal(t, name, c.Name(), "Name must be stable")

	id := c.Identity()
	require.NotEmpty(t, id)
	assert.Equal(t, id, c.Identity(), "Identity must be stable")

	same := h.Retune(t, c, codec.Tuning{})
	assert.Equal(t, id, same.Identity(), "codecs for one destination with one tuning must share an Identity")
	assert.Equal(t, name, same.Name())

	tuned := h.Retune(t, c, codec.Tuning{MaxEntries: max(1, c.Limits().MaxEntries-1)})
	assert.NotEqual(t, id, tuned.Identity(), "Identity must differ when MaxEntries differs")
	lingered := h.Retune(t, c, codec.Tuning{Linger: 17 * time.Millisecond})
	assert.NotEqual(t, id, lingered.Identity(), "Identity must differ when Linger differs")
	assert.NotEqual(t, tuned.Identity(), lingered.Identity())

	other := h.MakeCodec(t, codec.Tuning{})
	assert.NotEqual(t, id, other.Identity(), "Identity must differ between destinations")
}

func testLimitsAndTuning(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	l := c.Limits()
	require.Positive(t, l.MaxEntries)
	require.Positive(t, l.MaxBytes)
	assertWithin(t, c.Tuning(), l)

	want := codec.Tuning{MaxEntries: max(1, l.MaxEntries/2), MaxBytes: max(1, l.MaxBytes/2), Linger: 3 * time.Millisecond}
	tuned := h.Retune(t, c, want)
	assert.Equal(t, l, tuned.Limits(), "tuning must not change the Limits")
	assertWithin(t, tuned.Tuning(), l)
	assert.Equal(t, want.MaxEntries, tuned.Tuning().MaxEntries)
	assert.Equal(t, want.MaxBytes, tuned.Tuning().MaxBytes)
	assert.Equal(t, want.Linger, tuned.Tuning().Linger)
}

func assertWithin(t *testing.T, tu codec.Tuning, l codec.Limits) {
	t.Helper()
	assert.GreaterOrEqual(t, tu.MaxEntries, 0)
	assert.LessOrEqual(t, tu.MaxEntries, l.MaxEntries)
	assert.GreaterOrEqual(t, tu.MaxBytes, 0)
	assert.LessOrEqual(t, tu.MaxBytes, l.MaxBytes)
}

func testSize(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	base := codec.Message{Body: []byte("hello"), Group: "g", IdempotencyKey: "k"}
	s := c.Size(base)
	require.Positive(t, s)

	longer := base
	longer.Body = []byte("hello, world")
	assert.Greater(t, c.Size(longer), s, "Size must grow with the body")

	attributed := base
	attributed.Attributes = map[string]string{"colour": "blue"}
	assert.Greater(t, c.Size(attributed), s, "Size must grow with the attributes")
	more := base
	more.Attributes = map[string]string{"colour": "blue", "shape": "round"}
	assert.Greater(t, c.Size(more), c.Size(attributed), "Size must grow with each attribute")
}

// message returns the i-th test message of a run: unique body and key, a
// group of groups, two attributes.
func message(run string, i, groups int) codec.Message {
	return codec.Message{
		Tenant:         "tenant",
		Group:          fmt.Sprintf("%s-g%d", run, i%groups),
		IdempotencyKey: fmt.Sprintf("%s-k%d", run, i),
		Body:           []byte(fmt.Sprintf("%s body %d ünïcode ✓", run, i)),
		Attributes: map[string]string{
			"index": fmt.Sprint(i),
			"run":   run,
		},
	}
}

// groupsFor is how many groups a request to c may mix: want, or one when c's
// Limits say a request holds one group (the batcher builds such batches).
func groupsFor(c codec.Codec, want int) int {
	if c.Limits().OneGroupPerRequest {
		return 1
	}
	return want
}

func runID(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), time.Now().UnixNano())
}

func send(t *testing.T, c codec.Codec, batch []codec.Message) []codec.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.SendBatch(ctx, batch)
	require.NoError(t, err)
	require.Len(t, res, len(batch), "one Result per message")
	for i, r := range res {
		require.NoError(t, r.Err, "message %d", i)
		require.NotEmpty(t, r.ID, "message %d", i)
	}
	return res
}

// readBack polls h until it holds at least n messages and returns them.
func readBack(t *testing.T, h Harness, n int) []Received {
	t.Helper()
	var got []Received
	require.Eventually(t, func() bool {
		got = h.Received(t)
		return len(got) >= n
	}, ReadBackTimeout, 10*time.Millisecond, "want %d messages read back", n)
	return got
}

func testSendBatchFull(t *testing.T, h Harness, skip map[Field]bool) {
	c := h.MakeCodec(t, codec.Tuning{})
	n := c.Limits().MaxEntries
	if tn := c.Tuning().MaxEntries; tn > 0 {
		n = tn
	}
	run := runID(t)
	batch := make([]codec.Message, n)
	for i := range batch {
		batch[i] = message(run, i, groupsFor(c, 3))
	}
	res := send(t, c, batch)

	ids := map[string]int{}
	for i, r := range res {
		prev, dup := ids[r.ID]
		require.False(t, dup, "messages %d and %d share the ID %q", prev, i, r.ID)
		ids[r.ID] = i
	}

	got := readBack(t, h, n)
	assert.Len(t, got, n, "the destination holds more than was sent")
	for _, g := range got {
		i, ok := ids[g.ID]
		if !assert.True(t, ok, "received an unknown message id %q", g.ID) {
			continue
		}
		want := batch[i]
		assert.True(t, bytes.Equal(want.Body, g.Body), "message %d body: want %q, got %q", i, want.Body, g.Body)
		assert.Equal(t, want.Attributes, g.Attributes, "message %d attributes", i)
		if !skip[FieldGroup] {
			assert.Equal(t, want.Group, g.Group, "message %d group", i)
		}
		if !skip[FieldIdempotencyKey] {
			assert.Equal(t, want.IdempotencyKey, g.IdempotencyKey, "message %d idempotency key", i)
		}
	}
	for _, f := range []Field{FieldGroup, FieldIdempotencyKey} {
		if skip[f] {
			t.Logf("the destination does not report %v: not compared", f)
		}
	}
}

func testGroupOrder(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	n := c.Limits().MaxEntries
	run := runID(t)
	groups := groupsFor(c, 2)
	var sent []codec.Message
	for range 2 {
		batch := make([]codec.Message, n)
		for i := range batch {
			batch[i] = message(run, len(sent)+i, groups)
		}
		send(t, c, batch)
		sent = append(sent, batch...)
	}

	got := readBack(t, h, len(sent))
	byBody := map[string]codec.Message{}
	want := map[string][]string{}
	for _, m := range sent {
		byBody[string(m.Body)] = m
		want[m.Group] = append(want[m.Group], string(m.Body))
	}
	have := map[string][]string{}
	for _, g := range got {
		m, ok := byBody[string(g.Body)]
		if assert.True(t, ok, "received an unknown body %q", g.Body) {
			have[m.Group] = append(have[m.Group], string(g.Body))
		}
	}
	assert.Equal(t, want, have, "each group must arrive in send order")
}

func testCancelledContext(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.SendBatch(ctx, []codec.Message{message(runID(t), 0, 1)})
		done <- err
	}()
	select {
	case err := <-done:
		assert.Error(t, err, "SendBatch with a cancelled context must fail")
	case <-time.After(5 * time.Second):
		t.Fatal("SendBatch did not return within 5s of a cancelled context")
	}
}

func testValidate(t *testing.T, h Harness) {
	c := h.MakeCodec(t, codec.Tuning{})
	v, ok := c.(codec.Validator)
	if !ok {
		t.Skipf("%T is not a codec.Validator", c)
	}
	good := message(runID(t), 0, 1)
	assert.NoError(t, v.Validate(good), "a well-formed message must pass")

	empty := good
	empty.Body = nil
	empty.Attributes = nil
	err := v.Validate(empty)
	require.Error(t, err, "an empty message must be refused")
	assert.True(t, codec.IsPermanent(err), "the refusal of an empty message must be permanent: %v", err)
	assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch"), "error text must start with the package name: %q", err)
}
