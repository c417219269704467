package sqs_test

// The codec behind the batcher (package actors), on kumo: many concurrent
// callers, a standard and a FIFO queue, every acknowledged message read back.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/sqs"
)

// startInstance runs a sinkbatch instance for one test and stops it at the
// end.
func startInstance(t *testing.T) *actors.Instance {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	inst, err := actors.Start(system, actors.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, inst.Stop(c))
		system.Shutdown()
	})
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

func TestThroughBatcherStandard(t *testing.T) {
	e := newKumo(t)
	inst := startInstance(t)
	q := e.createQueue(t, false, false)
	p := newProxy(t, e.endpoint) // counts the requests
	c := e.codec(t, q, codec.Tuning{}, func(cfg *sqs.Config) { cfg.AWS.BaseEndpoint = aws.String(p.url) })

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

	requests := p.calls.Load()
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

func TestThroughBatcherFIFO(t *testing.T) {
	e := newKumo(t)
	inst := startInstance(t)
	q := e.createQueue(t, true, false)
	p := newProxy(t, e.endpoint)
	c := e.codec(t, q, codec.Tuning{}, func(cfg *sqs.Config) { cfg.AWS.BaseEndpoint = aws.String(p.url) })

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

	requests := p.calls.Load()
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

// TestThroughBatcherInvalid: a message the queue can never take is answered
// at once with a permanent error, and its neighbours go through.
func TestThroughBatcherInvalid(t *testing.T) {
	e := newKumo(t)
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
