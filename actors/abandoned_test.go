package actors_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// Deliver: "if ctx ends first, Deliver returns ctx.Err() and m is never
// sent unless its batch already left"; and an actor's future that timed out
// is a caller gone. A destination's one request slot is held by a request
// that waits for the test; meanwhile front-door callers and futures queue
// behind it, and half of each give up (a cancelled ctx, a future's
// timeout) while their entries are queued, not in a batch. Once the slot
// frees, none of the abandoned messages reaches the codec, every other
// caller gets its own id, and the counters come back to zero.
func TestAbandonedWhileQueuedIsNeverSent(t *testing.T) {
	const (
		callers = 40
		futures = 20
		within  = 10 * time.Second
	)
	system, inst := start(t, actors.Config{Name: "abandon"})
	c, v := valved("abandon", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}, codec.Tuning{Linger: time.Millisecond, MaxInflight: 1})
	plugged := plug(t, inst, c, v, within)

	type outcome struct {
		body string
		id   string
		err  error
	}
	results := make(chan outcome, callers+futures)
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, callers)
	for i := range callers {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		cancels[i] = cancel
		body := fmt.Sprintf("call%d", i)
		if i%2 == 1 {
			body = "gone-" + body
		}
		wg.Go(func() {
			id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint("t", i%4), Body: []byte(body)})
			results <- outcome{body, id, err}
		})
	}
	for i := range futures {
		body := fmt.Sprintf("future%d", i)
		timeout := within
		if i%2 == 1 {
			body, timeout = "gone-"+body, 100*time.Millisecond
		}
		d := &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "f", Body: []byte(body)}, Deadline: time.Now().Add(within)}
		f := system.Root.RequestFuture(inst.PID(), d, timeout)
		wg.Go(func() {
			res, err := f.Result()
			o := outcome{body: body, err: err}
			if err == nil {
				dl := res.(*messages.Delivered)
				o.id, o.err = dl.ID, dl.Err
			}
			results <- o
		})
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == callers+futures }, within, time.Millisecond, "all queued behind the plug")
	for i := 1; i < callers; i += 2 {
		cancels[i]()
	}
	// The abandoned futures time out by themselves; wait for every
	// abandoned caller to have returned before the slot frees.
	gone := 0
	var got []outcome
	for gone < callers/2+futures/2 {
		o := <-results
		got = append(got, o)
		require.True(t, strings.HasPrefix(o.body, "gone-"), "%s answered while the slot was held: %v", o.body, o.err)
		require.Error(t, o.err, o.body)
		gone++
	}
	v.Open()
	require.NoError(t, <-plugged)
	wg.Wait()
	close(results)
	for o := range results {
		got = append(got, o)
	}
	for i := range cancels {
		cancels[i]()
	}
	require.Len(t, got, callers+futures)
	for _, o := range got {
		if strings.HasPrefix(o.body, "gone-") {
			continue
		}
		if assert.NoError(t, o.err, o.body) {
			assert.Equal(t, "id-"+o.body, o.id)
		}
	}
	sent := map[string]bool{}
	for _, m := range c.Sent() {
		sent[string(m.Body)] = true
		assert.False(t, strings.HasPrefix(string(m.Body), "gone-"), "%s was sent after its caller gave up while it was queued", m.Body)
	}
	assert.Len(t, sent, 1+callers/2+futures/2, "the plug and every caller that waited were sent")
	require.Eventually(t, func() bool { s := inst.Stats(); return s.Queued == 0 && s.InFlight == 0 && s.QueuedBytes == 0 }, within, time.Millisecond)
}

// The same with WhenFull Block: behind a held slot, some callers are
// queued and the rest wait for room (Stats.Waiting); half of both give up.
// When the slot frees, room goes to the callers still waiting, none of the
// abandoned messages is sent, and Waiting and Queued come back to zero.
func TestAbandonedWhileBlockedIsNeverSent(t *testing.T) {
	const (
		queueMax = 4
		callers  = 2 * queueMax // queueMax queued, queueMax waiting (the waiting list holds as many)
		within   = 10 * time.Second
	)
	_, inst := start(t, actors.Config{Name: "block"})
	c, v := valved("block", codec.Limits{MaxEntries: 3, MaxBytes: 1 << 20},
		codec.Tuning{Linger: time.Millisecond, MaxInflight: 1, QueueMax: queueMax, WhenFull: codec.Block})
	plugged := plug(t, inst, c, v, within)

	type outcome struct {
		body string
		id   string
		err  error
	}
	results := make(chan outcome, callers)
	cancels := make([]context.CancelFunc, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		cancels[i] = cancel
		body := fmt.Sprintf("call%d", i)
		if i%2 == 1 {
			body = "gone-" + body
		}
		wg.Go(func() {
			id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint("t", i%3), Body: []byte(body)})
			results <- outcome{body, id, err}
		})
	}
	require.Eventually(t, func() bool {
		s := inst.Stats()
		return s.Queued == queueMax && s.Waiting == callers-queueMax
	}, within, time.Millisecond, "queued and waiting behind the plug")
	for i := 1; i < callers; i += 2 {
		cancels[i]()
	}
	var got []outcome
	for range callers / 2 {
		o := <-results
		got = append(got, o)
		require.True(t, strings.HasPrefix(o.body, "gone-"), "%s answered while the slot was held: %v", o.body, o.err)
		require.ErrorIs(t, o.err, context.Canceled, o.body)
	}
	v.Open()
	require.NoError(t, <-plugged)
	wg.Wait()
	close(results)
	for o := range results {
		got = append(got, o)
	}
	for _, cancel := range cancels {
		cancel()
	}
	for _, o := range got {
		if !strings.HasPrefix(o.body, "gone-") && assert.NoError(t, o.err, o.body) {
			assert.Equal(t, "id-"+o.body, o.id)
		}
	}
	for _, m := range c.Sent() {
		assert.False(t, strings.HasPrefix(string(m.Body), "gone-"), "%s was sent after its caller gave up", m.Body)
	}
	assert.Len(t, c.Sent(), 1+callers/2)
	require.Eventually(t, func() bool { s := inst.Stats(); return s.Queued == 0 && s.Waiting == 0 && s.InFlight == 0 }, within, time.Millisecond)
}

// plug makes c answer each message with an id of its body once v lets its
// request through, and starts one delivery that holds c's only slot at v
// until the test opens it; it returns that delivery's answer.
func plug(t *testing.T, inst *actors.Instance, c *fakecodec.Codec, v *valve, within time.Duration) <-chan error {
	t.Helper()
	inner := c.Hook
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		if _, err := inner(ctx, batch); err != nil {
			return nil, err
		}
		return echoIDs(ctx, batch)
	}
	t.Cleanup(v.Open)
	plugged := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_, err := inst.Deliver(ctx, c, codec.Message{Tenant: "plug", Body: []byte("plug")})
		plugged <- err
	}()
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, within, time.Millisecond, "the plug holds the slot")
	return plugged
}
