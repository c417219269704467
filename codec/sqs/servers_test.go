package sqs_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/codectest"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// TestKumo runs the server suite against kumo, in-process.
func TestKumo(t *testing.T) { testServer(t, newKumo) }

// TestFauxqs runs the server suite against fauxqs, started by
// .ci/fauxqs/start.sh; it skips when SINKBATCH_FAUXQS_ENDPOINT is unset.
func TestFauxqs(t *testing.T) { testServer(t, newFauxqs) }

func testServer(t *testing.T, mk func(testing.TB) *env) {
	e := mk(t)
	t.Run("Conformance/Standard", func(t *testing.T) { codectest.Run(t, &harness{env: e}) })
	t.Run("Conformance/FIFO", func(t *testing.T) { codectest.Run(t, &harness{env: e, fifo: true}) })
	t.Run("ReadBack/Standard", func(t *testing.T) { testReadBack(t, e, false) })
	t.Run("ReadBack/FIFO", func(t *testing.T) { testReadBack(t, e, true) })
	t.Run("FIFODeduplication", func(t *testing.T) { testDeduplication(t, e) })
	t.Run("ContentBasedDeduplication", func(t *testing.T) { testContentBased(t, e) })
	t.Run("QueueDoesNotExist", func(t *testing.T) { testNoQueue(t, e) })
	t.Run("InvalidNeverSent", func(t *testing.T) { testInvalidNeverSent(t, e) })
	if e.kind == "fauxqs" {
		t.Run("BatchRequestTooLong", func(t *testing.T) { testTooLong(t, e) })
		t.Run("TooManyEntries", func(t *testing.T) { testTooMany(t, e) })
		t.Run("InvalidMessageContents", func(t *testing.T) { testInvalidContents(t, e) })
	}
}

// sendAll sends msgs in requests of 10 and returns the results, all of which
// must be successes.
func sendAll(t *testing.T, c *sqs.Codec, msgs []codec.Message) []codec.Result {
	t.Helper()
	var all []codec.Result
	for len(msgs) > 0 {
		n := min(len(msgs), sqs.MaxEntries)
		res, err := c.SendBatch(ctx(t), msgs[:n])
		require.NoError(t, err)
		require.Len(t, res, n)
		for i, r := range res {
			require.NoError(t, r.Err, "message %q", msgs[i].Body)
			require.NotEmpty(t, r.ID)
		}
		all = append(all, res...)
		msgs = msgs[n:]
	}
	return all
}

// testReadBack sends 25 messages in 3 requests over 3 groups and reads
// every acknowledged one back with its attributes, idempotency key and, where
// the server reports them, group, deduplication id and sequence number.
func testReadBack(t *testing.T, e *env, fifo bool) {
	q := e.createQueue(t, fifo, false)
	c := e.codec(t, q, codec.Tuning{})
	msgs := batchOf(runName(t), 0, 25, 3)
	res := sendAll(t, c, msgs)

	got := e.readBack(t, q, len(msgs))
	require.Len(t, got, len(msgs))
	byID := map[string]message{}
	for _, g := range got {
		byID[g.ID] = g
	}
	for i, m := range msgs {
		g, ok := byID[res[i].ID]
		if !assert.True(t, ok, "acknowledged message %d (%s) not read back", i, res[i].ID) {
			continue
		}
		assert.Equal(t, string(m.Body), string(g.Body))
		assert.Equal(t, m.Attributes, g.Attributes)
		assert.Equal(t, m.IdempotencyKey, g.IdempotencyKey)
		if fifo {
			assert.NotEmpty(t, res[i].Sequence, "a FIFO queue answers a sequence number")
		} else {
			assert.Empty(t, res[i].Sequence)
		}
		if fifo && e.kind == "fauxqs" {
			assert.Equal(t, m.Group, g.Group)
			assert.Equal(t, m.IdempotencyKey, g.DedupID)
			assert.Equal(t, res[i].Sequence, g.Sequence)
		}
	}
	if fifo {
		// Per group, arrival order is send order.
		want, have := map[string][]string{}, map[string][]string{}
		group := map[string]string{}
		for _, m := range msgs {
			want[m.Group] = append(want[m.Group], string(m.Body))
			group[string(m.Body)] = m.Group
		}
		for _, g := range got {
			have[group[string(g.Body)]] = append(have[group[string(g.Body)]], string(g.Body))
		}
		assert.Equal(t, want, have)
	}
}

// testDeduplication sends a batch to a FIFO queue twice with the same
// idempotency keys: the queue stores each message once and answers the
// second send with the first message ids.
func testDeduplication(t *testing.T, e *env) {
	q := e.createQueue(t, true, false)
	c := e.codec(t, q, codec.Tuning{})
	msgs := batchOf(runName(t), 0, 10, 2)
	first := sendAll(t, c, msgs)
	again := sendAll(t, c, msgs)
	for i := range first {
		assert.Equal(t, first[i].ID, again[i].ID, "a duplicate is answered with the original message id")
	}
	got := e.readBack(t, q, len(msgs))
	assert.Len(t, got, len(msgs), "the queue stored a duplicate")
}

// testContentBased: a FIFO queue with content-based deduplication takes
// messages without an idempotency key when the codec is told so, and the
// codec refuses them when it is not.
func testContentBased(t *testing.T, e *env) {
	q := e.createQueue(t, true, true)
	m := codec.Message{Group: "g", Body: []byte("no key " + runName(t))}

	strict := e.codec(t, q, codec.Tuning{})
	err := strict.Validate(m)
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, sqs.CodeMissingDeduplication, ee.Code)
	assert.True(t, codec.IsPermanent(err))

	cbd := e.codec(t, q, codec.Tuning{}, func(c *sqs.Config) { c.ContentBasedDeduplication = true })
	require.NoError(t, cbd.Validate(m))
	res := sendAll(t, cbd, []codec.Message{m})
	got := e.readBack(t, q, 1)
	require.Len(t, got, 1)
	assert.Equal(t, res[0].ID, got[0].ID)
	assert.NotEqual(t, strict.Identity(), cbd.Identity())
}

// testNoQueue: sending to a queue that does not exist fails every message
// permanently. fauxqs refuses the whole request, kumo each entry.
func testNoQueue(t *testing.T, e *env) {
	q := e.createQueue(t, false, false)
	u, err := url.Parse(q)
	require.NoError(t, err)
	u.Path = strings.TrimSuffix(u.Path, "/"+pathBase(u.Path)) + "/no-such-queue"
	c := e.codec(t, u.String(), codec.Tuning{})
	msgs := batchOf(runName(t), 0, 3, 1)
	res, err := c.SendBatch(ctx(t), msgs)
	if err != nil {
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee)
		assert.True(t, ee.Permanent)
		assert.True(t, codec.IsPermanent(err))
		assert.False(t, errors.Is(err, codec.ErrRefused))
		assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/sqs: "), err.Error())
		t.Logf("%s: whole request: %v", e.kind, err)
		return
	}
	require.Len(t, res, len(msgs))
	for _, r := range res {
		assert.True(t, codec.IsPermanent(r.Err), "%v", r.Err)
	}
	t.Logf("%s: per entry: %v", e.kind, res[0].Err)
}

func pathBase(p string) string { return p[strings.LastIndex(p, "/")+1:] }

// testInvalidNeverSent: SendBatch answers an invalid message with
// Validate's error, sends the valid ones, and the invalid one never reaches
// the queue.
func testInvalidNeverSent(t *testing.T, e *env) {
	q := e.createQueue(t, true, false)
	c := e.codec(t, q, codec.Tuning{})
	msgs := batchOf(runName(t), 0, 4, 2)
	msgs[1].Body = []byte("bad \x00 body")
	msgs[2].Group = "" // a FIFO message without a group
	res, err := c.SendBatch(ctx(t), msgs)
	require.NoError(t, err)
	require.Len(t, res, 4)
	assert.NoError(t, res[0].Err)
	assert.NoError(t, res[3].Err)
	for _, i := range []int{1, 2} {
		assert.True(t, codec.IsPermanent(res[i].Err), "%v", res[i].Err)
		assert.Empty(t, res[i].ID)
	}
	var ee *codec.EntryError
	require.ErrorAs(t, res[1].Err, &ee)
	assert.Equal(t, sqs.CodeInvalidMessageContent, ee.Code)
	require.ErrorAs(t, res[2].Err, &ee)
	assert.Equal(t, sqs.CodeMissingGroup, ee.Code)

	got := e.readBack(t, q, 2)
	require.Len(t, got, 2)
	assert.ElementsMatch(t, []string{res[0].ID, res[3].ID}, []string{got[0].ID, got[1].ID})
}

// bigBatch is three messages of 400 KiB each: each fits, together they
// pass SQS's 1 MiB per request.
func bigBatch(run string) []codec.Message {
	b := batchOf(run, 0, 3, 1)
	for i := range b {
		b[i].Body = []byte(fmt.Sprintf("%d%s", i, strings.Repeat("x", 400<<10)))
	}
	return b
}

// testTooLong: a request over 1 MiB in total, as the batcher would never
// pack it, comes back refused (codec.ErrRefused) so the batcher bisects.
func testTooLong(t *testing.T, e *env) {
	q := e.createQueue(t, false, false)
	c := e.codec(t, q, codec.Tuning{})
	b := bigBatch(runName(t))
	total := 0
	for _, m := range b {
		require.NoError(t, c.Validate(m))
		total += c.Size(m)
	}
	require.Greater(t, total, sqs.MaxBytes)
	_, err := c.SendBatch(ctx(t), b)
	require.ErrorIs(t, err, codec.ErrRefused)
	assert.Contains(t, err.Error(), "BatchRequestTooLong")
	assert.True(t, strings.HasPrefix(err.Error(), "sinkbatch/sqs: "), err.Error())

	// The halves the batcher would try next go through.
	sendAll(t, c, b[:2])
	sendAll(t, c, b[2:])
	assert.Len(t, e.readBack(t, q, 3), 3)
}

// testTooMany: eleven entries are refused (codec.ErrRefused).
func testTooMany(t *testing.T, e *env) {
	q := e.createQueue(t, false, false)
	c := e.codec(t, q, codec.Tuning{})
	_, err := c.SendBatch(ctx(t), batchOf(runName(t), 0, 11, 1))
	require.ErrorIs(t, err, codec.ErrRefused)
	assert.Contains(t, err.Error(), "TooManyEntriesInBatchRequest")
	assert.Empty(t, e.drain(t, q))
}

// testInvalidContents puts a body SQS refuses on the wire, past Validate:
// fauxqs fails that entry with InvalidMessageContents (SenderFault), which
// the codec answers as permanent for that message only.
func testInvalidContents(t *testing.T, e *env) {
	q := e.createQueue(t, false, false)
	c := e.codec(t, q, codec.Tuning{})
	msgs := batchOf(runName(t), 0, 3, 1)
	msgs[1].Body = []byte("bell \x07 here")
	require.Error(t, c.Validate(msgs[1]), "Validate would have kept it back")
	res, err := sqs.SendUnvalidated(ctx(t), c, msgs)
	require.NoError(t, err)
	require.Len(t, res, 3)
	assert.NoError(t, res[0].Err)
	assert.NoError(t, res[2].Err)
	var ee *codec.EntryError
	require.ErrorAs(t, res[1].Err, &ee)
	assert.Equal(t, "InvalidMessageContents", ee.Code)
	assert.True(t, ee.Permanent)
	assert.True(t, codec.IsPermanent(res[1].Err))
	assert.Len(t, e.readBack(t, q, 2), 2)
}
