package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

var lim10 = codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}

type result struct {
	id  string
	err error
}

// deliverAsync starts a Deliver with its own deadline and returns its answer
// on a channel.
func deliverAsync(inst *actors.Instance, c codec.Codec, m codec.Message, timeout time.Duration) <-chan result {
	ch := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		id, err := inst.Deliver(ctx, c, m)
		ch <- result{id, err}
	}()
	return ch
}

func await(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return result{}
	}
}

func msg(tenant, group, body string) codec.Message {
	return codec.Message{Tenant: tenant, Group: group, Body: []byte(body)}
}

// 1. One batcher per destination.
func TestConcurrentFirstDeliveriesStartOneBatcher(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "one", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	const n = 200
	codecs := make([]*fakecodec.Codec, n) // distinct values, one identity
	for i := range codecs {
		codecs[i] = fakecodec.New("same-queue", lim10)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := inst.Deliver(context.Background(), codecs[i], msg("t", "", "x"))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, inst.Stats().Batchers)
	assert.Equal(t, 1, logs.Count("batcher started"))
	var sent int
	for _, c := range codecs {
		sent += len(c.Sent())
	}
	assert.Equal(t, n, sent)
}

func TestCodecsThatDifferOnlyInCredentialsNeverShareARequest(t *testing.T) {
	logs := &testinst.Buffer{}
	system, inst := start(t, actors.Config{Name: "creds", Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	a := fakecodec.New("queue-1|key=AKIA|secret=TOPSECRET-A", lim10)
	b := fakecodec.New("queue-1|key=AKIA|secret=TOPSECRET-B", lim10)
	var chans []<-chan result
	for i := range 40 {
		c := a
		if i%2 == 1 {
			c = b
		}
		chans = append(chans, deliverAsync(inst, c, msg("t", "", fmt.Sprint(i)), 5*time.Second))
	}
	for _, ch := range chans {
		require.NoError(t, await(t, ch).err)
	}
	for _, m := range a.Sent() {
		var i int
		fmt.Sscan(string(m.Body), &i)
		assert.Zero(t, i%2, "b's message went out in a's request")
	}
	assert.Len(t, b.Sent(), 20)
	assert.Equal(t, 2, inst.Stats().Batchers)

	// No secret in any actor name or log line.
	var names []string
	for _, shard := range system.ProcessRegistry.LocalPIDs.LocalPIDs {
		names = append(names, shard.Keys()...)
	}
	joined := strings.Join(names, "\n")
	assert.Contains(t, joined, "sinkbatch-creds/fake-")
	assert.NotContains(t, joined, "TOPSECRET")
	assert.NotContains(t, logs.String(), "TOPSECRET")
}

// 2. Actors deliver without blocking and get their Ref back.
type sender struct {
	inst  *actors.Instance
	c     codec.Codec
	n     int
	got   map[any]*messages.Delivered
	order []string
	done  chan struct{}
}

func (s *sender) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		for i := range s.n {
			ctx.Request(s.inst.PID(), &messages.Deliver{Codec: s.c, Message: msg("a", "g", fmt.Sprint(i)), Ref: i})
		}
	case *messages.Delivered:
		s.got[m.Ref] = m
		if m.Err == nil {
			s.order = append(s.order, fmt.Sprint(m.Ref))
		}
		if len(s.got) == s.n {
			close(s.done)
		}
	}
}

func TestActorsDeliverWithoutBlockingAndGroupOrderHolds(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "actor"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 3, MaxBytes: 1 << 20})
	c.Latency = time.Millisecond
	s := &sender{inst: inst, c: c, n: 300, got: map[any]*messages.Delivered{}, done: make(chan struct{})}
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return s }))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the actor was not answered")
	}
	var want []string
	for i := range s.n {
		want = append(want, fmt.Sprint(i))
		require.NotNil(t, s.got[i], "ref %d", i)
		assert.NoError(t, s.got[i].Err)
		assert.NotEmpty(t, s.got[i].ID)
	}
	var sent []string
	for _, m := range c.Sent() {
		sent = append(sent, string(m.Body))
	}
	assert.Equal(t, want, sent, "the destination saw the group in the order the actor sent it")
	assert.Equal(t, want, s.order, "successes came back in order")
}

// 3. A full batch leaves at once; MaxInflight bounds the requests in flight.
func TestFullBatchLeavesWithoutLingerAndInflightIsBounded(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "full"})
	c, v := valved("q", lim10, codec.Tuning{Linger: time.Hour, MaxInflight: 3})
	var chans []<-chan result
	for i := range 50 {
		chans = append(chans, deliverAsync(inst, c, msg(fmt.Sprint(i%5), "", "x"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return v.entered.Load() == 3 }, 5*time.Second, time.Millisecond,
		"three full batches leave although Linger is an hour")
	require.Eventually(t, func() bool { return inst.Stats().Queued == 20 }, 5*time.Second, time.Millisecond)
	st := inst.Stats()
	assert.Equal(t, 3, st.InFlight)
	assert.Equal(t, int64(20), st.QueuedBytes)
	v.Open()
	for _, ch := range chans {
		assert.NoError(t, await(t, ch).err)
	}
	assert.Equal(t, int64(3), c.MaxInflight())
	assert.Equal(t, []int{10, 10, 10, 10, 10}, c.BatchSizes())
}

// 4. Fairness: a tenant's backlog does not delay another tenant.
func TestSmallTenantIsInterleavedWithAFlood(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "fair"})
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 1, Linger: time.Hour})
	var chans []<-chan result
	for range 200 {
		chans = append(chans, deliverAsync(inst, c, msg("flood", "", "f"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 190 }, 5*time.Second, time.Millisecond)
	for range 10 {
		chans = append(chans, deliverAsync(inst, c, msg("small", "", "s"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 200 }, 5*time.Second, time.Millisecond)
	v.Open()
	for _, ch := range chans {
		require.NoError(t, await(t, ch).err)
	}
	sent := c.Sent()
	last := 0
	for i, m := range sent {
		if m.Tenant == "small" {
			last = i
		}
	}
	// After the batch in flight, the small tenant's entries alternate with
	// the flood's 190: all ten are out within the next 20 entries, not
	// after the flood.
	assert.Less(t, last, 30, "the small tenant waited behind the flood")
}

// 5. At most one request per group in flight.
func TestAGroupHasOneRequestInFlight(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "groups"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20})
	v := newValve()
	v.Open()
	c.Tune = codec.Tuning{MaxInflight: 8, Linger: time.Millisecond}
	c.Latency = 2 * time.Millisecond
	c.Hook = v.Hook
	// Each delivery takes a ticket when it is submitted and another when it
	// is acknowledged. A message acknowledged before another of its group
	// was submitted must reach the destination first.
	var clock atomic.Int64
	type stamp struct{ submitted, acked int64 }
	var mu sync.Mutex
	stamps := map[string]stamp{}
	var wg sync.WaitGroup
	for g := range 6 {
		for caller := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 20 {
					body := fmt.Sprintf("%d-%d-%d", g, caller, i)
					submitted := clock.Add(1)
					_, err := inst.Deliver(context.Background(), c, msg(fmt.Sprint(caller), fmt.Sprint(g), body))
					acked := clock.Add(1)
					if assert.NoError(t, err) {
						mu.Lock()
						stamps[body] = stamp{submitted, acked}
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	assert.Zero(t, v.overlap.Load(), "two requests of one group were in flight at once")
	perGroup := map[string][]string{}
	for _, m := range c.Sent() {
		perGroup[m.Group] = append(perGroup[m.Group], string(m.Body))
	}
	violations := 0
	for _, bodies := range perGroup {
		for i, later := range bodies {
			for _, earlier := range bodies[i+1:] {
				// earlier reached the destination after later: it must not
				// have been acknowledged before later was submitted.
				if stamps[earlier].acked < stamps[later].submitted {
					violations++
				}
			}
		}
	}
	assert.Len(t, c.Sent(), 6*4*20)
	assert.Zero(t, violations, "a message overtook one of its group acknowledged before it was sent")
}

// 6. Bounds: refused at once with a jittered retry-after; nothing queued.
func TestQueueBoundsRefuseAtOnce(t *testing.T) {
	rec := &recorder{}
	_, inst := start(t, actors.Config{Name: "bounds", Recorder: rec})
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 1, QueueMax: 20, TenantMax: 15, RetryAfterMax: 300 * time.Millisecond, Linger: time.Hour})
	var chans []<-chan result
	for range 10 { // the first batch, in flight
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "x"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	for range 15 {
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "x"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 15 }, 5*time.Second, time.Millisecond)

	r := await(t, deliverAsync(inst, c, msg("a", "", "x"), 10*time.Second))
	var ra *messages.RetryAfterError
	require.ErrorAs(t, r.err, &ra)
	assert.Equal(t, messages.FullTenant, ra.Reason)
	assert.Greater(t, ra.After, time.Duration(0))
	assert.LessOrEqual(t, ra.After, 300*time.Millisecond)

	for range 5 {
		chans = append(chans, deliverAsync(inst, c, msg("b", "", "x"), 10*time.Second))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 20 }, 5*time.Second, time.Millisecond)
	afters := map[time.Duration]bool{}
	for range 5 {
		r = await(t, deliverAsync(inst, c, msg("c", "", "x"), 10*time.Second))
		require.ErrorAs(t, r.err, &ra)
		assert.Equal(t, messages.FullEntries, ra.Reason)
		afters[ra.After] = true
	}
	assert.Greater(t, len(afters), 1, "retry-after is jittered")
	assert.Equal(t, 20, inst.Stats().Queued, "refused deliveries were not queued")
	assert.Equal(t, []messages.FullReason{messages.FullTenant, messages.FullEntries, messages.FullEntries,
		messages.FullEntries, messages.FullEntries, messages.FullEntries}, rec.Refusals())
	v.Open()
	for _, ch := range chans {
		assert.NoError(t, await(t, ch).err)
	}
	assert.Len(t, c.Sent(), 30)
}

func TestQueueBytesBoundAndTooLarge(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "bytes"})
	c, v := valved("q", codec.Limits{MaxEntries: 10, MaxBytes: 100}, codec.Tuning{MaxInflight: 1, QueueMaxBytes: 150, Linger: time.Hour})
	first := deliverAsync(inst, c, msg("a", "", strings.Repeat("x", 100)), 10*time.Second) // a full batch by bytes
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	second := deliverAsync(inst, c, msg("a", "", strings.Repeat("x", 100)), 10*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().QueuedBytes == 100 }, 5*time.Second, time.Millisecond)

	r := await(t, deliverAsync(inst, c, msg("b", "", strings.Repeat("x", 60)), 10*time.Second))
	var ra *messages.RetryAfterError
	require.ErrorAs(t, r.err, &ra)
	assert.Equal(t, messages.FullBytes, ra.Reason)

	r = await(t, deliverAsync(inst, c, msg("b", "", strings.Repeat("x", 101)), 10*time.Second))
	require.ErrorIs(t, r.err, codec.ErrTooLarge)
	assert.True(t, codec.IsPermanent(r.err))
	assert.Contains(t, r.err.Error(), "101 bytes")
	v.Open()
	require.NoError(t, await(t, first).err)
	require.NoError(t, await(t, second).err)
}

// 7. Abandoned entries are never sent and hold no room.
func TestAbandonedEntriesAreNotSentAndFreeTheirRoom(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "abandon"})
	// A linger long enough that the first request goes full, with all ten
	// of "a" (a full batch does not wait for it), however slow the machine:
	// the queue must be empty before the abandoned callers fill it.
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 1, QueueMax: 10, Linger: time.Second})
	inFlight := deliverAsync(inst, c, msg("a", "", "in-flight"), 10*time.Second)
	for range 9 {
		_ = deliverAsync(inst, c, msg("a", "", "filler"), 10*time.Second)
	}
	require.Eventually(t, func() bool { return v.entered.Load() == 1 && inst.Stats().Queued == 0 }, 5*time.Second, time.Millisecond,
		"the first request takes all ten")

	// Fill the queue with callers that give up: some by deadline, some by
	// cancelling their context.
	var cancels []context.CancelFunc
	var gone []chan result
	for i := range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		timeout := time.Hour
		if i%2 == 0 {
			timeout = 200 * time.Millisecond
		}
		ctx, cancel2 := context.WithTimeout(ctx, timeout)
		cancels = append(cancels, cancel, cancel2)
		ch := make(chan result, 1)
		gone = append(gone, ch)
		go func() {
			id, err := inst.Deliver(ctx, c, msg("b", "", "abandoned"))
			ch <- result{id, err}
		}()
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 10 }, 5*time.Second, time.Millisecond)
	for i, cancel := range cancels {
		if i%4 == 2 { // the odd callers' outer cancel
			cancel()
		}
	}
	for _, ch := range gone {
		r := await(t, ch)
		assert.True(t, errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded), "%v", r.err)
	}
	// Every queued caller is gone: a new delivery is admitted, not refused.
	fresh := deliverAsync(inst, c, msg("c", "", "fresh"), 10*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)
	// Let its linger run out, so that it is due the moment the slot frees
	// (while the slot is busy, nothing wakes the batcher for it).
	time.Sleep(10 * time.Millisecond)
	v.Open()
	require.NoError(t, await(t, inFlight).err)
	require.NoError(t, await(t, fresh).err)
	for _, m := range c.Sent() {
		assert.NotEqual(t, "abandoned", string(m.Body))
	}
	for _, cancel := range cancels {
		cancel()
	}
}

// 8. SendBatch panics and wrong result counts answer the batch; the batcher
// goes on.
func TestCodecFaultsAnswerTheBatch(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "faults", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c := fakecodec.New("q", lim10)
	c.Tune.Linger = time.Millisecond
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		switch string(batch[0].Body) {
		case "panic":
			panic("codec bug")
		case "short":
			return make([]codec.Result, len(batch)-1), nil
		}
		return make([]codec.Result, len(batch)), nil
	}
	r := await(t, deliverAsync(inst, c, msg("a", "", "panic"), 5*time.Second))
	assert.ErrorIs(t, r.err, codec.ErrCodecPanic)
	assert.Contains(t, logs.String(), "codec bug")
	assert.Contains(t, logs.String(), "goroutine", "the panic is logged with its stack")
	r = await(t, deliverAsync(inst, c, msg("a", "", "short"), 5*time.Second))
	assert.ErrorIs(t, r.err, codec.ErrResultCount)
	r = await(t, deliverAsync(inst, c, msg("a", "", "fine"), 5*time.Second))
	assert.NoError(t, r.err)
}

// 9. Bisection isolates the refused message.
func TestBisectionIsolatesARefusedMessage(t *testing.T) {
	rec := &recorder{}
	_, inst := start(t, actors.Config{Name: "bisect", Recorder: rec})
	const n = 100
	c := fakecodec.New("q", codec.Limits{MaxEntries: n, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Hour}
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		for _, m := range batch {
			if string(m.Body) == "poison" {
				return nil, fmt.Errorf("InvalidArgument: bad message: %w", codec.ErrRefused)
			}
		}
		return make([]codec.Result, len(batch)), nil
	}
	var chans []<-chan result
	for i := range n {
		body := fmt.Sprint(i)
		if i == 37 {
			body = "poison"
		}
		chans = append(chans, deliverAsync(inst, c, msg(fmt.Sprint(i%3), "", body), 10*time.Second))
	}
	for i, ch := range chans {
		r := await(t, ch)
		if i == 37 {
			assert.ErrorIs(t, r.err, codec.ErrRefused)
			assert.True(t, codec.IsPermanent(r.err))
		} else {
			assert.NoError(t, r.err)
		}
	}
	assert.Len(t, c.Sent(), n-1)
	bound := 1 + 2*int(math.Ceil(math.Log2(n)))
	assert.LessOrEqual(t, c.Requests(), int64(bound))
	require.Eventually(t, func() bool { return len(rec.Flushes()) == 1 }, 5*time.Second, time.Millisecond)
	f := rec.Flushes()[0]
	assert.Equal(t, telemetry.TriggerEntries, f.Trigger)
	assert.Equal(t, n, f.Entries)
	assert.Equal(t, int(c.Requests()), f.Requests)
	assert.Equal(t, f.Requests-1, f.Bisections)
}

// A half that fails for a reason other than a refusal ends the bisection:
// the later half is not sent, so it cannot overtake the failed one.
func TestBisectionStopsAtAFailedHalf(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "bisect-fail"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 8, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Hour}
	throttled := &codec.EntryError{Code: "Throttling", Message: "slow down"}
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		if len(batch) == 8 {
			return nil, fmt.Errorf("one bad entry: %w", codec.ErrRefused)
		}
		return nil, throttled // the first half: the destination is throttling now
	}
	var chans []<-chan result
	for i := range 8 {
		chans = append(chans, deliverAsync(inst, c, msg("a", "g", fmt.Sprint(i)), 10*time.Second))
	}
	for _, ch := range chans {
		r := await(t, ch)
		assert.ErrorIs(t, r.err, throttled)
		assert.False(t, codec.IsPermanent(r.err))
	}
	assert.Equal(t, int64(2), c.Requests(), "the refused request and its first half; the second half was not sent")
}

// A caller whose deadline passes while its entry is in a request is
// answered then, not when the request ends; its batch mates are not.
func TestCallerInARequestIsAnsweredAtItsDeadline(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "inflight-deadline"})
	c, v := valved("q", codec.Limits{MaxEntries: 2, MaxBytes: 1 << 20}, codec.Tuning{Linger: time.Hour})
	patient := deliverAsync(inst, c, msg("a", "", "patient"), 30*time.Second)
	f := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: msg("b", "", "hasty"),
		Deadline: time.Now().Add(100 * time.Millisecond), Ref: "hasty"}, 30*time.Second)
	res, err := f.Result() // the request is held open: only the deadline can answer this
	require.NoError(t, err)
	d := res.(*messages.Delivered)
	assert.Equal(t, "hasty", d.Ref)
	require.ErrorIs(t, d.Err, context.DeadlineExceeded)
	assert.Contains(t, d.Err.Error(), "may have been stored")
	assert.False(t, codec.IsPermanent(d.Err))
	assert.Equal(t, int64(1), v.entered.Load(), "both were in the request")
	v.Open()
	r := await(t, patient)
	assert.NoError(t, r.err)
	assert.NotEmpty(t, r.id)
}

// crashOnRefusal is a Recorder whose Refused panics once armed: a bug in the
// operator's metrics code, called from the batcher's Receive, restarts the
// batcher.
type crashOnRefusal struct{ armed atomic.Bool }

func (r *crashOnRefusal) Sink(string) telemetry.SinkRecorder { return r }
func (r *crashOnRefusal) Flushed(telemetry.Flush)            {}
func (r *crashOnRefusal) Refused(messages.FullReason) {
	if r.armed.CompareAndSwap(true, false) {
		panic("recorder bug")
	}
}

// 10. A crashed batcher answers everything it held, and is back.
func TestBatcherCrashAnswersEveryoneAndRestarts(t *testing.T) {
	logs := &testinst.Buffer{}
	crash := &crashOnRefusal{}
	_, inst := start(t, actors.Config{Name: "crash", Logger: slog.New(slog.NewTextHandler(logs, nil)), Recorder: crash})
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 1, Linger: time.Hour, QueueMax: 10})
	var chans []<-chan result
	for range 20 { // 10 in flight, 10 queued
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "x"), 30*time.Second))
	}
	require.Eventually(t, func() bool { return v.entered.Load() == 1 && inst.Stats().Queued == 10 }, 5*time.Second, time.Millisecond)
	crash.armed.Store(true)
	boom := deliverAsync(inst, c, msg("a", "", "boom"), 30*time.Second) // refused: the queue is full
	start := time.Now()
	for _, ch := range append(chans, boom) {
		assert.ErrorIs(t, await(t, ch).err, messages.ErrBatcherDown)
	}
	assert.Less(t, time.Since(start), 5*time.Second, "callers were answered at once, not at their deadline")
	assert.Contains(t, logs.String(), "level=WARN msg=\"sinkbatch: batcher crashed; restarting it\"")
	assert.Contains(t, logs.String(), "destination=fake-")
	assert.Contains(t, logs.String(), "recorder bug")
	require.Eventually(t, func() bool { return inst.Stats() == actors.Stats{Batchers: 1} }, 5*time.Second, time.Millisecond)

	v.Open() // the cancelled request's late result is ignored
	chans = chans[:0]
	for range 10 {
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "after"), 5*time.Second))
	}
	for _, ch := range chans {
		r := await(t, ch)
		assert.NoError(t, r.err)
		assert.NotEmpty(t, r.id)
	}
}

// 10, 3 and 5 across a restart: a request of the crashed batcher, which its
// codec is slow to give up, still holds its slot and its group: the new
// batcher sends nothing until it ends.
func TestACrashedBatchersRequestHoldsItsSlotUntilItEnds(t *testing.T) {
	crash := &crashOnRefusal{}
	_, inst := start(t, actors.Config{Name: "crash", Recorder: crash})
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before the instance's Stop, even if the test fails early
	var inflight, most atomic.Int64
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{MaxInflight: 1, Linger: time.Millisecond, QueueMax: 1}
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if string(batch[0].Body) == "1" {
			<-release // deaf to its cancelled ctx
		}
		return make([]codec.Result, len(batch)), nil
	}
	first := deliverAsync(inst, c, msg("a", "g", "1"), 30*time.Second)
	require.Eventually(t, func() bool { return c.Requests() == 1 }, 5*time.Second, time.Millisecond)
	filler := deliverAsync(inst, c, msg("a", "g", "filler"), 30*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)
	crash.armed.Store(true)
	assert.ErrorIs(t, await(t, deliverAsync(inst, c, msg("a", "", "boom"), 30*time.Second)).err, messages.ErrBatcherDown)
	assert.ErrorIs(t, await(t, filler).err, messages.ErrBatcherDown)
	assert.ErrorIs(t, await(t, first).err, messages.ErrBatcherDown)

	second := deliverAsync(inst, c, msg("a", "g", "2"), 30*time.Second)
	time.Sleep(50 * time.Millisecond) // its linger is 1 ms: it would be out by now
	assert.Equal(t, int64(1), c.Requests(), "g's next message waits for the crashed batcher's request")
	open()
	assert.NoError(t, await(t, second).err)
	assert.Equal(t, int64(1), most.Load(), "one request in flight at a time")
}

// brokenListener is a batcher.Listener whose Listening panics after its
// first answer (at admission): a bug in code the batcher calls while it
// takes a batch.
type brokenListener struct {
	asked   atomic.Int32
	answers chan codec.Result
}

func (l *brokenListener) Listening(*actor.PID) bool {
	if l.asked.Add(1) == 1 {
		return true // at admission
	}
	panic("listener bug")
}

func (l *brokenListener) Answer(_ *actor.PID, r codec.Result) { l.answers <- r }

// 10. A panic in the batcher's rules on a request goroutine, which takes the
// next batch when its request ends, restarts the batcher as one in Receive
// does, instead of ending the process: once, though two goroutines end, and
// every caller it held is answered, the one whose entry the failed take had
// already taken out of the queue too.
func TestPanicOnARequestGoroutineRestartsTheBatcher(t *testing.T) {
	logs := &testinst.Buffer{}
	system, inst := start(t, actors.Config{Name: "crash", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 2, Linger: time.Millisecond})
	first := deliverAsync(inst, c, msg("z", "", "1"), 30*time.Second)
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	second := deliverAsync(inst, c, msg("z", "", "2"), 30*time.Second)
	require.Eventually(t, func() bool { return v.entered.Load() == 2 }, 5*time.Second, time.Millisecond)

	// Queued behind the busy slots: only a request goroutine, when its
	// request ends, can take them. Round-robin takes a's entry, then asks
	// about b's caller.
	taken := deliverAsync(inst, c, msg("a", "", "x"), 30*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)
	broken := &brokenListener{answers: make(chan codec.Result, 1)}
	caller := &actor.PID{Address: system.Address(), Id: "broken", RequestId: 1}
	system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: msg("b", "", "y"), Ref: &batcher.Direct{Listener: broken}}, caller)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond)
	// Let their linger run out, so that they are due the moment a slot
	// frees (while the slots are busy, nothing wakes the batcher for them).
	time.Sleep(10 * time.Millisecond)
	v.Open()

	start := time.Now()
	for _, ch := range []<-chan result{first, second} {
		// Answered by its request, or by the restart if that came first.
		if err := await(t, ch).err; err != nil {
			assert.ErrorIs(t, err, messages.ErrBatcherDown)
		}
	}
	assert.ErrorIs(t, await(t, taken).err, messages.ErrBatcherDown)
	select {
	case r := <-broken.answers:
		assert.ErrorIs(t, r.Err, messages.ErrBatcherDown)
	case <-time.After(5 * time.Second):
		t.Fatal("the entry held by the crashed batcher was not answered")
	}
	assert.Less(t, time.Since(start), 5*time.Second, "answered at once, not at the deadline")
	r := await(t, deliverAsync(inst, c, msg("a", "", "after"), 5*time.Second))
	assert.NoError(t, r.err, "the batcher is back")
	assert.Equal(t, int32(2), broken.asked.Load(), "asked at admission and by the failed take; the other goroutine took nothing from the crashed queue")
	assert.Equal(t, 1, logs.Count("batcher crashed; restarting it"))
	assert.Contains(t, logs.String(), "listener bug (on a request goroutine)")
}

// 11. Idle stop, and deliveries racing it.
func TestIdleBatcherStopsAndIsReplaced(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "idle", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{IdleTimeout: 20 * time.Millisecond, Linger: time.Millisecond}
	require.NoError(t, await(t, deliverAsync(inst, c, msg("a", "", "1"), 5*time.Second)).err)
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 5*time.Second, time.Millisecond)
	assert.Contains(t, logs.String(), "batcher stopped idle")
	require.NoError(t, await(t, deliverAsync(inst, c, msg("a", "", "2"), 5*time.Second)).err)
	assert.Equal(t, 2, logs.Count("batcher started"))
}

func TestDeliveriesRacingIdleStopsAreNeitherLostNorLate(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "race", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	// One sequential caller per destination: each next delivery races its
	// batcher's idle stop, which is reported a nanosecond after each answer.
	codecs := make([]*fakecodec.Codec, 16)
	var wg sync.WaitGroup
	for g := range codecs {
		c := fakecodec.New(fmt.Sprint("q", g), lim10)
		c.Tune = codec.Tuning{IdleTimeout: time.Nanosecond, Linger: time.Nanosecond}
		codecs[g] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := inst.Deliver(ctx, c, msg("t", "", fmt.Sprint(i)))
				cancel()
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	for _, c := range codecs {
		assert.Len(t, c.Sent(), 100)
	}
	t.Logf("idle stops: %d", logs.Count("batcher stopped idle"))
	assert.GreaterOrEqual(t, logs.Count("batcher stopped idle"), 16, "idle stops raced the deliveries")
}

// 12. Stop drains, refuses newcomers, and gives up at its deadline.
func TestStopSendsEverythingQueuedAtOnce(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "stop"})
	require.NoError(t, err)
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: time.Hour}
	var chans []<-chan result
	for i := range 25 {
		chans = append(chans, deliverAsync(inst, c, msg("a", fmt.Sprint(i%2), "x"), 30*time.Second))
	}
	// All 25 have arrived: 20 went out in two full batches, 5 wait.
	require.Eventually(t, func() bool { return len(c.Sent()) == 20 && inst.Stats().Queued == 5 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, inst.Stop(ctx))
	for _, ch := range chans {
		assert.NoError(t, await(t, ch).err)
	}
	assert.Len(t, c.Sent(), 25)
	assert.Equal(t, actors.Stats{}, inst.Stats())
	_, err = inst.Deliver(context.Background(), c, msg("a", "", "late"))
	assert.ErrorIs(t, err, messages.ErrStopped)
	f := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: msg("a", "", "late")}, 5*time.Second)
	res, err := f.Result()
	require.NoError(t, err)
	assert.ErrorIs(t, res.(*messages.Delivered).Err, messages.ErrStopped)
	require.NoError(t, inst.Stop(ctx), "a second Stop returns the first's outcome")
}

// A batcher that crashes while Stop drains it goes on draining once it is
// back, so Stop ends as soon as every delivery is answered.
func TestStopOutlivesARestartDuringItsDrain(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "drain"})
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 1, Linger: time.Millisecond})
	first := deliverAsync(inst, c, msg("z", "", "1"), 30*time.Second)
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	broken := &brokenListener{answers: make(chan codec.Result, 1)}
	caller := &actor.PID{Address: system.Address(), Id: "broken", RequestId: 1}
	system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: msg("b", "", "y"), Ref: &batcher.Direct{Listener: broken}}, caller)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- inst.Stop(ctx)
	}()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		_, err := inst.Deliver(ctx, c, msg("late", "", "x"))
		return errors.Is(err, messages.ErrStopped)
	}, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // for the Drain to reach the batcher
	// The request goroutine takes b's entry, and the take panics.
	v.Open()

	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not end once every delivery was answered")
	}
	if err := await(t, first).err; err != nil {
		assert.ErrorIs(t, err, messages.ErrBatcherDown)
	}
	assert.ErrorIs(t, (<-broken.answers).Err, messages.ErrBatcherDown)
	assert.Equal(t, int32(2), broken.asked.Load(), "at admission, and by the failed take")
	assert.Equal(t, actors.Stats{}, inst.Stats())
}

func TestStopGivesUpAtItsDeadline(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "stuck"})
	require.NoError(t, err)
	c, _ := valved("q", lim10, codec.Tuning{MaxInflight: 1, Linger: time.Hour})
	var chans []<-chan result
	for range 15 {
		chans = append(chans, deliverAsync(inst, c, msg("a", "", "x"), time.Minute))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 5 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = inst.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for _, ch := range chans {
		assert.ErrorIs(t, await(t, ch).err, messages.ErrStopped)
	}
	assert.Equal(t, actors.Stats{}, inst.Stats())
}

// 14. Bad input is answered at once.
func TestBadCodecsAreRefusedAtOnce(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "bad"})
	tests := []struct {
		name string
		c    codec.Codec
		want string
	}{
		{"nil codec", nil, "nil codec"},
		{"no entries", fakecodec.New("a", codec.Limits{MaxEntries: 0, MaxBytes: 10}), "Limits().MaxEntries 0 is not positive"},
		{"no bytes", fakecodec.New("b", codec.Limits{MaxEntries: 1, MaxBytes: -1}), "Limits().MaxBytes -1 is not in [1, 2 GiB)"},
		{"too many bytes", fakecodec.New("b2", codec.Limits{MaxEntries: 1, MaxBytes: 1 << 31}), "Limits().MaxBytes 2147483648 is not in [1, 2 GiB)"},
		{"negative linger", &fakecodec.Codec{ID: "c", Lim: lim10, Tune: codec.Tuning{Linger: -time.Second}}, "Tuning.Linger -1s is negative"},
		{"above the limit", &fakecodec.Codec{ID: "d", Lim: lim10, Tune: codec.Tuning{MaxEntries: 11}}, "Tuning.MaxEntries 11 is above the destination's limit 10"},
		{"negative queue", &fakecodec.Codec{ID: "e", Lim: lim10, Tune: codec.Tuning{QueueMax: -1}}, "Tuning.QueueMax -1 is negative"},
		{"bad name", &fakecodec.Codec{Kind: "a/b", ID: "f", Lim: lim10}, "codec Name() \"a/b\" may hold only"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := inst.Deliver(context.Background(), tc.c, msg("a", "", "x"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.Zero(t, inst.Stats().Batchers, "nothing was started")
}

func TestStartRefusesBadConfig(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	for _, cfg := range []actors.Config{{Name: "has space"}, {SinkConcurrency: -1}, {DefaultTimeout: -time.Second}} {
		_, err := actors.Start(system, cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	inst, err := actors.Start(system, actors.Config{Name: "dup"})
	require.NoError(t, err)
	_, err = actors.Start(system, actors.Config{Name: "dup"})
	assert.Error(t, err, "two instances with one name")
	require.NoError(t, inst.Stop(context.Background()))
	again, err := actors.Start(system, actors.Config{Name: "dup"})
	require.NoError(t, err, "a stopped instance's name can be taken again")
	require.NoError(t, again.Stop(context.Background()))
}
