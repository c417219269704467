package pubsub_test

// Tests of the codec behind the batcher (package actors) on pstest.

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// startInstance runs a sinkbatch instance for one test and stops it at the
// end.
func startInstance(t testing.TB) *actors.Instance {
	t.Helper()
	_, inst := testinst.Start(t, actors.Config{})
	return inst
}

// outcome is one delivery's answer.
type outcome struct {
	body string
	id   string
	err  error
}

// deliverAll delivers every message at once, each from its own goroutine
// under one 30 s deadline, and returns the answers in msgs' order.
func deliverAll(t *testing.T, inst *actors.Instance, c codec.Codec, msgs []codec.Message) []outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]outcome, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := inst.Deliver(ctx, c, m)
			out[i] = outcome{string(m.Body), id, err}
		}()
	}
	wg.Wait()
	return out
}

func TestThroughBatcherOrderedAndUnordered(t *testing.T) {
	srv := newServer(t)
	c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
	inst := startInstance(t)

	const (
		keys        = 64
		perKey      = 40 // sent one after another by the key's caller
		tenants     = 8
		perTenant   = 4 // unordered callers per tenant
		perUnordCal = 60
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var (
		mu       sync.Mutex
		outcomes []outcome
		// successes per key, in the order their callers saw them succeed
		okOrder = map[string][]string{}
		wg      sync.WaitGroup
	)
	record := func(o outcome, key string) {
		mu.Lock()
		defer mu.Unlock()
		outcomes = append(outcomes, o)
		if o.err == nil && key != "" {
			okOrder[key] = append(okOrder[key], o.body)
		}
	}
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("key-%02d", k)
			for i := range perKey {
				m := codec.Message{Tenant: fmt.Sprint("t", k%tenants), Group: key, Body: []byte(fmt.Sprintf("%s/%d", key, i)), IdempotencyKey: fmt.Sprintf("%s/%d", key, i)}
				id, err := inst.Deliver(ctx, c, m)
				record(outcome{string(m.Body), id, err}, key)
			}
		}()
	}
	for tn := range tenants {
		for cl := range perTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perUnordCal {
					m := codec.Message{Tenant: fmt.Sprint("t", tn), Body: []byte(fmt.Sprintf("t%d/c%d/%d", tn, cl, i))}
					id, err := inst.Deliver(ctx, c, m)
					record(outcome{string(m.Body), id, err}, "")
				}
			}()
		}
	}
	wg.Wait()

	total := keys*perKey + tenants*perTenant*perUnordCal
	require.Len(t, outcomes, total)
	acked := map[string]string{} // body -> id
	for _, o := range outcomes {
		require.NoError(t, o.err, o.body)
		acked[o.body] = o.id
	}
	got := srv.Messages()
	seen := map[string]int{}
	serverOrder := map[string][]string{}
	for _, m := range got {
		seen[string(m.Data)]++
		assert.Equal(t, acked[string(m.Data)], m.ID, "the id the caller got is the server's")
		if m.OrderingKey != "" {
			serverOrder[m.OrderingKey] = append(serverOrder[m.OrderingKey], string(m.Data))
		}
	}
	assert.Len(t, got, total)
	for body := range acked {
		assert.Equal(t, 1, seen[body], "%s published once", body)
	}
	assert.Equal(t, okOrder, serverOrder, "each key's order on the server is the order of its successes")
}

func TestThroughBatcherPoisonIsBisected(t *testing.T) {
	rec := &recorder{fail: refusePoison}
	srv := newServer(t, rec.option())
	// The bound below holds for one request of all n: a Linger long past
	// the time n callers take to post, on a loaded machine too (at 200 ms,
	// a CI run once split them over two requests, one call more), and the
	// request goes as soon as it is full.
	c := newCodec(t, srv.Addr, testTopic, codec.Tuning{Linger: 5 * time.Second})
	inst := startInstance(t)

	const n = 1000
	msgs := make([]codec.Message, n)
	for i := range msgs {
		body := fmt.Sprint("m", i)
		if i == 617 {
			body = "poison"
		}
		msgs[i] = codec.Message{Tenant: fmt.Sprint("t", i%7), Body: []byte(body)}
	}
	out := deliverAll(t, inst, c, msgs)

	for i, o := range out {
		if o.body == "poison" {
			require.Error(t, o.err)
			assert.ErrorIs(t, o.err, codec.ErrRefused)
			assert.True(t, codec.IsPermanent(o.err), "the poison's caller gets a permanent error")
			continue
		}
		require.NoError(t, o.err, "message %d", i)
		assert.NotEmpty(t, o.id)
	}
	assert.Len(t, srv.Messages(), n-1)
	bound := 1 + 2*int(math.Ceil(math.Log2(n)))
	assert.LessOrEqual(t, rec.calls.Load(), int64(bound), "Publish calls within 1 + 2·⌈log2 %d⌉", n)
	t.Logf("%d Publish calls for %d messages with one poison", rec.calls.Load(), n)
}

func TestThroughBatcherFailures(t *testing.T) {
	t.Run("transient Unavailable on the 3rd call", func(t *testing.T) {
		var (
			mu     sync.Mutex
			failed = map[string]bool{}
		)
		rec := &recorder{fail: func(n int64, req *pubsubpb.PublishRequest) error {
			if n != 3 {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range req.Messages {
				failed[string(m.Data)] = true
			}
			return status.Error(codes.Unavailable, "transient")
		}}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{MaxEntries: 20})
		inst := startInstance(t)

		const n = 200
		msgs := make([]codec.Message, n)
		for i := range msgs {
			msgs[i] = codec.Message{Body: []byte(fmt.Sprint("m", i))}
		}
		out := deliverAll(t, inst, c, msgs)

		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, failed, "the 3rd call happened")
		for _, o := range out {
			if failed[o.body] {
				require.Error(t, o.err, o.body)
				assert.False(t, codec.IsPermanent(o.err), "retryable: %v", o.err)
				assert.Equal(t, codes.Unavailable, status.Code(o.err))
				continue
			}
			assert.NoError(t, o.err, o.body)
		}
		assert.Len(t, srv.Messages(), n-len(failed))
	})

	t.Run("a request over the server's 4 MiB receive limit is bisected", func(t *testing.T) {
		srv := newServer(t)
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{Linger: 200 * time.Millisecond})
		inst := startInstance(t)
		msgs := make([]codec.Message, 3)
		for i := range msgs {
			msgs[i] = codec.Message{Body: append(make([]byte, 2<<20), byte(i))}
		}
		msgs = append(msgs, codec.Message{Body: make([]byte, 5<<20)})
		out := deliverAll(t, inst, c, msgs)
		for _, o := range out[:3] {
			assert.NoError(t, o.err)
		}
		require.Error(t, out[3].err, "too large for this server on its own")
		assert.True(t, codec.IsPermanent(out[3].err))
		assert.Equal(t, codes.ResourceExhausted, status.Code(out[3].err))
		assert.Len(t, srv.Messages(), 3)
	})

	t.Run("NotFound is permanent", func(t *testing.T) {
		srv := newServer(t)
		c := newCodec(t, srv.Addr, "projects/p/topics/missing", codec.Tuning{})
		inst := startInstance(t)
		msgs := make([]codec.Message, 50)
		for i := range msgs {
			msgs[i] = msg(i)
		}
		for _, o := range deliverAll(t, inst, c, msgs) {
			err := o.err
			require.Error(t, err)
			assert.True(t, codec.IsPermanent(err), "%v", err)
			assert.Equal(t, codes.NotFound, status.Code(err))
		}
	})

	t.Run("an invalid message is refused at admission", func(t *testing.T) {
		rec := &recorder{}
		srv := newServer(t, rec.option())
		c := newCodec(t, srv.Addr, testTopic, codec.Tuning{})
		inst := startInstance(t)
		_, err := inst.Deliver(context.Background(), c, codec.Message{Group: "g"})
		require.Error(t, err)
		assert.True(t, codec.IsPermanent(err))
		assert.Contains(t, err.Error(), "EmptyMessage")
		assert.Zero(t, rec.calls.Load())
	})
}
