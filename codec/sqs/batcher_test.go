package sqs_test

// The codec behind the batcher (package actors), on kumo and fauxqs: many
// concurrent callers, a standard and a FIFO queue, every acknowledged message
// read back; a request SQS refuses, bisected down to its poison message.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/internal/sqstest"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// startInstance runs a sinkbatch instance for one test and stops it at the
// end.
func startInstance(t *testing.T) *actors.Instance {
	t.Helper()
	_, inst := testinst.Start(t, actors.Config{})
	return inst
}

// delivered is one caller's acknowledged message.
type delivered struct {
	id    string
	body  string
	group string
}

// deliverAll runs callers concurrently; caller k delivers its messages one
// after another and reports the acknowledged ones in the order it got them.
func deliverAll(t *testing.T, inst *actors.Instance, c codec.Codec, callers [][]codec.Message) [][]delivered {
	t.Helper()
	out := make([][]delivered, len(callers))
	errs := make([][]error, len(callers))
	var wg sync.WaitGroup
	for k, msgs := range callers {
		wg.Go(func() {
			for _, m := range msgs {
				dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				id, err := inst.Deliver(dctx, c, m)
				cancel()
				if err != nil {
					errs[k] = append(errs[k], err)
					continue
				}
				out[k] = append(out[k], delivered{id: id, body: string(m.Body), group: m.Group})
			}
		})
	}
	wg.Wait()
	for k := range errs {
		require.Empty(t, errs[k], "caller %d", k)
	}
	return out
}

func TestThroughBatcher(t *testing.T) {
	for _, srv := range []struct {
		name string
		mk   func(testing.TB) *env
	}{{"kumo", newKumo}, {"fauxqs", newFauxqs}} {
		t.Run(srv.name, func(t *testing.T) {
			t.Run("Standard", func(t *testing.T) { testThroughBatcherStandard(t, srv.mk(t)) })
			t.Run("FIFO", func(t *testing.T) { testThroughBatcherFIFO(t, srv.mk(t)) })
			t.Run("Invalid", func(t *testing.T) { testThroughBatcherInvalid(t, srv.mk(t)) })
			t.Run("RefusalBisected", func(t *testing.T) { testThroughBatcherRefusal(t, srv.mk(t)) })
		})
	}
}

func testThroughBatcherStandard(t *testing.T, e *env) {
	inst := startInstance(t)
	q := e.createQueue(t, false, false)
	p := sqstest.New(t, e.endpoint) // counts the requests
	c := e.codec(t, q, codec.Tuning{}, func(cfg *sqs.Config) { cfg.AWS.BaseEndpoint = aws.String(p.URL) })

	const callers, each = 16, 20
	run := runName(t)
	msgs := make([][]codec.Message, callers)
	for k := range msgs {
		msgs[k] = batchOf(fmt.Sprintf("%s-c%d", run, k), 0, each, 1)
		for i := range msgs[k] {
			msgs[k][i].Tenant = fmt.Sprintf("tenant-%d", k%4)
			msgs[k][i].Group = "" // unordered
		}
	}
	acked := deliverAll(t, inst, c, msgs)

	requests := p.Calls()
	t.Logf("%d messages in %d requests", callers*each, requests)
	assert.Less(t, requests, int64(callers*each/2), "the batcher batches")

	got := e.readBack(t, q, callers*each)
	// A standard queue delivers at least once: a request the SDK retried
	// after a lost answer may have stored a message twice, under two ids.
	assert.GreaterOrEqual(t, len(got), callers*each)
	byID := map[string]message{}
	for _, g := range got {
		byID[g.ID] = g
	}
	for _, list := range acked {
		for _, d := range list {
			g, ok := byID[d.id]
			if assert.True(t, ok, "acknowledged %s missing", d.id) {
				assert.Equal(t, d.body, string(g.Body))
			}
		}
	}
}

func testThroughBatcherFIFO(t *testing.T, e *env) {
	inst := startInstance(t)
	q := e.createQueue(t, true, false)
	p := sqstest.New(t, e.endpoint)
	c := e.codec(t, q, codec.Tuning{}, func(cfg *sqs.Config) { cfg.AWS.BaseEndpoint = aws.String(p.URL) })

	const groups, each = 12, 25
	run := runName(t)
	msgs := make([][]codec.Message, groups)
	for g := range msgs {
		msgs[g] = batchOf(fmt.Sprintf("%s-%d", run, g), 0, each, 1) // one group per caller
		for i := range msgs[g] {
			msgs[g][i].Tenant = fmt.Sprintf("tenant-%d", g%3)
		}
	}
	acked := deliverAll(t, inst, c, msgs)

	requests := p.Calls()
	t.Logf("%d messages in %d requests", groups*each, requests)
	assert.Less(t, requests, int64(groups*each/2), "the batcher batches across groups")

	got := e.readBack(t, q, groups*each)
	require.Len(t, got, groups*each, "deduplication ids keep a retried request from storing twice")
	group := map[string]string{}
	want := map[string][]string{}
	for _, list := range acked {
		for _, d := range list {
			group[d.id] = d.group
			want[d.group] = append(want[d.group], d.id)
		}
	}
	have := map[string][]string{}
	for _, g := range got {
		gr, ok := group[g.ID]
		require.True(t, ok, "unknown message %s", g.ID)
		have[gr] = append(have[gr], g.ID)
	}
	assert.Equal(t, want, have, "each group arrives in the order its caller was answered")
}

// testThroughBatcherInvalid: a message the queue can never take is answered
// at once with a permanent error, and its neighbours go through.
func testThroughBatcherInvalid(t *testing.T, e *env) {
	inst := startInstance(t)
	q := e.createQueue(t, true, false)
	c := e.codec(t, q, codec.Tuning{})

	msgs := batchOf(runName(t), 0, 3, 1)
	msgs[1].Group = ""
	var ids []string
	for i, m := range msgs {
		id, err := inst.Deliver(ctx(t), c, m)
		if i == 1 {
			var ee *codec.EntryError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, sqs.CodeMissingGroup, ee.Code)
			assert.True(t, codec.IsPermanent(err))
			continue
		}
		require.NoError(t, err)
		ids = append(ids, id)
	}
	got := e.readBack(t, q, 2)
	require.Len(t, got, 2)
	assert.Equal(t, ids, []string{got[0].ID, got[1].ID})
}

// testThroughBatcherRefusal: the proxy refuses, as SQS would refuse a
// request past its limits, every request that holds the poison message.
// The codec answers codec.ErrRefused, the batcher bisects, the poison alone
// is answered with a permanent refusal and every other message is stored.
func testThroughBatcherRefusal(t *testing.T, e *env) {
	inst := startInstance(t)
	q := e.createQueue(t, false, false)
	p := sqstest.New(t, e.endpoint)
	p.Set(func(c *sqstest.Call) sqstest.Action {
		if !bytes.Contains(c.Body, []byte("poison")) {
			return sqstest.Action{}
		}
		return sqstest.Action{Answer: sqstest.Error(http.StatusBadRequest, "BatchRequestTooLong", "injected for the poison message")}
	})
	c := e.codec(t, q, codec.Tuning{Linger: 20 * time.Millisecond}, func(cfg *sqs.Config) { cfg.AWS.BaseEndpoint = aws.String(p.URL) })

	const n = 30
	msgs := batchOf(runName(t), 0, n, 1)
	poison := 17
	msgs[poison].Body = []byte("the poison message")
	for i := range msgs {
		msgs[i].Group = ""
	}
	type answer struct {
		id  string
		err error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			id, err := inst.Deliver(ctx(t), c, m)
			answers[i] = answer{id, err}
		})
	}
	wg.Wait()

	var ids []string
	for i, a := range answers {
		if i == poison {
			require.ErrorIs(t, a.err, codec.ErrRefused)
			assert.True(t, codec.IsPermanent(a.err))
			assert.Contains(t, a.err.Error(), "BatchRequestTooLong")
			continue
		}
		require.NoError(t, a.err, "message %d", i)
		ids = append(ids, a.id)
	}
	t.Logf("%d requests for %d messages and one poison", p.Calls(), n-1)
	got := e.readBack(t, q, n-1)
	have := make([]string, len(got))
	for i, g := range got {
		have[i] = g.ID
	}
	assert.Subset(t, have, ids, "every acknowledged message is stored")
}
