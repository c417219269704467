package actors_test

// Regression tests for issue #10: each promise of "every caller answered
// exactly once" that an outside caller broke through the public API. Each
// test names the item it covers and fails on the code before its fix.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// answerCounter is a reply process that counts the *messages.Delivered it
// is sent, per RequestId: an actor caller as protoactor sees one.
type answerCounter struct {
	mu      sync.Mutex
	answers map[uint32]int
	errs    map[string]int
	total   atomic.Int64
}

func newAnswerCounter(system *actor.ActorSystem, name string) (*answerCounter, *actor.PID) {
	c := &answerCounter{answers: map[uint32]int{}, errs: map[string]int{}}
	pid, ok := system.ProcessRegistry.Add(c, name)
	if !ok {
		panic("name taken: " + name)
	}
	return c, pid
}

func (c *answerCounter) SendUserMessage(pid *actor.PID, message any) {
	d, ok := actor.UnwrapEnvelopeMessage(message).(*messages.Delivered)
	if !ok {
		return
	}
	c.mu.Lock()
	c.answers[pid.RequestId]++
	kind := "ok"
	if d.Err != nil {
		kind = d.Err.Error()
		if errors.Is(d.Err, messages.ErrStopped) {
			kind = "stopped"
		}
	}
	c.errs[kind]++
	c.mu.Unlock()
	c.total.Add(1)
}
func (c *answerCounter) SendSystemMessage(*actor.PID, any) {}
func (c *answerCounter) Stop(*actor.PID)                   {}

// twice is how many requests were answered more than once.
func (c *answerCounter) twice() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.answers {
		if k > 1 {
			n++
		}
	}
	return n
}

// 1. A batcher that receives only deliveries it answers without queueing
// them (too large here) is idle: it stops, though its report raced them. A
// burst in its mailbox makes the race certain: the idle tick passes the
// deliveries waiting there, so the first report carries a count short of
// what was forwarded.
func TestIdleBatcherStopsAfterAReportThatRacedUnqueuedDeliveries(t *testing.T) {
	logs := &testinst.Buffer{}
	system, inst := start(t, actors.Config{Name: "trickle", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 10})
	c.Tune = codec.Tuning{IdleTimeout: time.Millisecond, Linger: time.Millisecond}
	c.SizeHook = func(m codec.Message) int {
		spin(20 * time.Microsecond)
		return len(m.Body)
	}
	require.NoError(t, await(t, deliverAsync(inst, c, msg("a", "", "ok"), 5*time.Second)).err)
	for range 5000 { // about 100 ms of work for the batcher
		system.Root.Send(inst.PID(), &messages.Deliver{Codec: c, Message: msg("a", "", "far too large")})
	}
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 5*time.Second, time.Millisecond,
		"the batcher never stopped after its idle report raced unqueued deliveries")
	assert.Equal(t, 1, logs.Count("batcher stopped idle"))
}

// spin busies the goroutine for d, as a costly codec method would.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// 2. Stop whose ctx ends at once still answers every delivery that entered
// a mailbox: actor callers get one *messages.Delivered each, Deliver callers
// return by the time Stop has (plus scheduling slack), not at their own
// deadline.
func TestStopWithAShortContextAnswersEveryDelivery(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "short"})
	require.NoError(t, err)
	c, v := valved("q", lim10, codec.Tuning{MaxInflight: 2, Linger: time.Millisecond, QueueMax: 100000, TenantMax: 100000})
	defer v.Open()
	c.SizeHook = func(m codec.Message) int {
		spin(10 * time.Microsecond)
		return len(m.Body)
	}
	counter, counterPID := newAnswerCounter(system, "short-callers")
	defer system.ProcessRegistry.Remove(counterPID)

	const actorCallers, goCallers = 20000, 2000
	deadline := time.Now().Add(time.Minute)
	var returned atomic.Int64
	var wg sync.WaitGroup
	for i := range goCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = inst.Deliver(ctx, c, msg(fmt.Sprint("g", i%7), "", "x"))
			returned.Add(1)
		}()
	}
	// Actor callers from four goroutines, and Stop while they send: the
	// batcher's mailbox holds thousands when Stop's ctx ends.
	half := make(chan struct{})
	var sending sync.WaitGroup
	for g := range 4 {
		sending.Add(1)
		go func() {
			defer sending.Done()
			for i := g; i < actorCallers; i += 4 {
				if i == actorCallers/2 {
					close(half)
				}
				sender := &actor.PID{Address: system.Address(), Id: counterPID.Id, RequestId: uint32(i + 1)}
				system.Root.RequestWithCustomSender(inst.PID(), &messages.Deliver{Codec: c, Message: msg(fmt.Sprint("a", i%5), "", "y"), Deadline: deadline}, sender)
			}
		}()
	}
	<-half
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err = inst.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	sending.Wait()
	stopped := time.Now()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%d of %d Deliver callers still waiting 5s after Stop returned", goCallers-returned.Load(), goCallers)
	}
	require.Eventually(t, func() bool { return counter.total.Load() >= actorCallers }, 5*time.Second, time.Millisecond,
		"actor callers answered: %d of %d", counter.total.Load(), actorCallers)
	assert.Less(t, time.Since(stopped), 5*time.Second)
	assert.Equal(t, int64(actorCallers), counter.total.Load())
	assert.Zero(t, counter.twice(), "answered twice")
	assert.Equal(t, actors.Stats{}, inst.Stats())
}

// 3, 8. A nil context or codec is an error at once, however the call ends.
func TestNilContextAndNilCodecAreAnsweredAtOnce(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "nils"})
	var noCtx context.Context // nil: the point of the test
	_, err := inst.Deliver(noCtx, fakecodec.New("q", lim10), msg("a", "", "x"))
	assert.ErrorIs(t, err, actors.ErrNilContext)
	assert.True(t, codec.IsPermanent(err))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = inst.Deliver(ctx, nil, msg("a", "", "x"))
	assert.ErrorIs(t, err, messages.ErrNilCodec)

	var typedNil *fakecodec.Codec
	for range 3 { // not cached as a destination either
		_, err = inst.Deliver(context.Background(), typedNil, msg("a", "", "x"))
		assert.ErrorIs(t, err, messages.ErrNilCodec)
		assert.True(t, codec.IsPermanent(err), "a caller following the error table stops retrying")
	}
	res, err := quietFuture(t, system, inst, &messages.Deliver{Codec: typedNil, Message: msg("a", "", "x")})
	require.NoError(t, err)
	assert.ErrorIs(t, res.Err, messages.ErrNilCodec)
	assert.Zero(t, inst.Stats().Batchers)
}

// quietFuture sends d to inst from a future and returns its answer.
func quietFuture(t *testing.T, system *actor.ActorSystem, inst *actors.Instance, d *messages.Deliver) (*messages.Delivered, error) {
	t.Helper()
	r, err := system.Root.RequestFuture(inst.PID(), d, 5*time.Second).Result()
	if err != nil {
		return nil, err
	}
	return r.(*messages.Delivered), nil
}

// valueCodec is a codec that is not a pointer: it cannot key the codec
// cache, so the supervisor digests its identity on every delivery.
type valueCodec struct{ *fakecodec.Codec }

// 4. Callers that gave up free their room, whatever the codec's type, and
// actor callers that stopped waiting without a word free it too.
func TestAbandonedCallersFreeTheirRoomForValueCodecs(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "room"})
	fc := fakecodec.New("q", lim10)
	fc.Tune = codec.Tuning{Linger: time.Hour, QueueMax: 5}
	c := valueCodec{fc}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := inst.Deliver(ctx, c, msg("a", "", "x"))
			assert.ErrorIs(t, err, context.Canceled)
		}()
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 5 }, 5*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	ch := deliverAsync(inst, c, msg("b", "", "y"), 50*time.Millisecond)
	err := await(t, ch).err
	var full *messages.RetryAfterError
	assert.False(t, errors.As(err, &full), "refused for room held by callers that left: %v", err)

	// Actor callers whose futures time out before their Deliver.Deadline.
	for range 5 {
		_ = system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: msg("c", "", "z"), Deadline: time.Now().Add(time.Hour)}, 20*time.Millisecond)
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 5 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the futures time out
	err = await(t, deliverAsync(inst, c, msg("d", "", "w"), 50*time.Millisecond)).err
	assert.False(t, errors.As(err, &full), "refused for room held by futures that timed out: %v", err)
}

// 5. A QueueMaxBytes that cannot hold one full request is refused, with the
// field named, as a permanent error: it would refuse a message forever.
func TestQueueMaxBytesBelowOneRequestIsRefused(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "qmb"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1000})
	c.Tune = codec.Tuning{QueueMaxBytes: 100}
	_, err := inst.Deliver(context.Background(), c, msg("a", "", "x"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Tuning.QueueMaxBytes 100")
	assert.True(t, codec.IsPermanent(err))
	var full *messages.RetryAfterError
	assert.False(t, errors.As(err, &full))
}

// 6. A deadline after the year 2262 is far away, not past.
func TestDeadlinesBeyondTheYear2262AreFarAway(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "far"})
	c := fakecodec.New("q", lim10)
	c.Tune = codec.Tuning{Linger: time.Millisecond}
	far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithDeadline(context.Background(), far)
	defer cancel()
	id, err := inst.Deliver(ctx, c, msg("a", "", "x"))
	require.NoError(t, err)
	assert.NotEmpty(t, id)
	res, err := quietFuture(t, system, inst, &messages.Deliver{Codec: c, Message: msg("a", "", "y"), Deadline: far})
	require.NoError(t, err)
	assert.NoError(t, res.Err)
}

// sizePanics panics in Size and Validate for the bodies it is told.
type sizePanics struct{ *fakecodec.Codec }

func (c sizePanics) Size(m codec.Message) int {
	if string(m.Body) == "size-boom" {
		panic("size bug")
	}
	return len(m.Body)
}

func (c sizePanics) Validate(m codec.Message) error {
	if string(m.Body) == "validate-boom" {
		panic("validate bug")
	}
	return nil
}

// 7. A message whose Size or Validate panics is answered alone, with a
// permanent error wrapping codec.ErrCodecPanic; the others stay queued and
// are sent; the batcher does not restart.
func TestAPanickingSizeOrValidateAnswersOnlyItsMessage(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "poison", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	fc := fakecodec.New("q", lim10)
	fc.Tune = codec.Tuning{Linger: time.Hour}
	c := &sizePanics{fc}
	var others []<-chan result
	for range 5 {
		others = append(others, deliverAsync(inst, c, msg("a", "", "x"), 30*time.Second))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 5 }, 5*time.Second, time.Millisecond)
	for _, body := range []string{"size-boom", "validate-boom"} {
		for range 2 { // its retry gets the same answer
			_, err := inst.Deliver(context.Background(), c, msg("a", "", body))
			assert.ErrorIs(t, err, codec.ErrCodecPanic, body)
			assert.True(t, codec.IsPermanent(err), body)
		}
	}
	assert.Equal(t, 5, inst.Stats().Queued, "the other callers' entries are still queued")
	for range 5 { // fill the batch
		others = append(others, deliverAsync(inst, c, msg("b", "", "y"), 30*time.Second))
	}
	for _, ch := range others {
		assert.NoError(t, await(t, ch).err)
	}
	assert.Zero(t, logs.Count("batcher crashed"))
}

// panickyRecorder panics in Sink, or in Flushed, as its fields say.
type panickyRecorder struct{ inSink, inFlushed bool }

func (r *panickyRecorder) Sink(string) telemetry.SinkRecorder {
	if r.inSink {
		panic("recorder Sink bug")
	}
	return r
}
func (r *panickyRecorder) Flushed(telemetry.Flush) {
	if r.inFlushed {
		panic("recorder Flushed bug")
	}
}
func (r *panickyRecorder) Refused(messages.FullReason) {}

// onceNamed answers Name once, then panics: user code the supervisor must
// not call again outside a recover.
type onceNamed struct {
	*fakecodec.Codec
	calls atomic.Int32
}

func (c *onceNamed) Name() string {
	if c.calls.Add(1) > 1 {
		panic("Name bug")
	}
	return "fake"
}

// 9. User code the supervisor calls (Recorder.Sink, Codec.Name) and the
// Recorder on a request goroutine (Flushed) cannot take the instance down.
func TestPanicsInUserCodeTheSupervisorCallsLoseNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  *panickyRecorder
		c    codec.Codec
	}{
		{"Recorder.Sink", &panickyRecorder{inSink: true}, nil},
		{"Recorder.Flushed", &panickyRecorder{inFlushed: true}, nil},
		{"Codec.Name after the first call", &panickyRecorder{}, &onceNamed{Codec: fakecodec.New("n", lim10)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, inst := start(t, actors.Config{Name: "user", Recorder: tc.rec})
			c := tc.c
			if c == nil {
				fc := fakecodec.New("q", lim10)
				fc.Tune = codec.Tuning{Linger: time.Millisecond}
				c = fc
			}
			// The first delivery alone: it starts the batcher, and caches
			// the codec so that no later one calls Name.
			require.NoError(t, await(t, deliverAsync(inst, c, msg("a", "", "first"), 10*time.Second)).err)
			var chans []<-chan result
			for i := range 20 {
				chans = append(chans, deliverAsync(inst, c, msg("a", "", fmt.Sprint(i)), 10*time.Second))
			}
			for _, ch := range chans {
				assert.NoError(t, await(t, ch).err)
			}
		})
	}
}

// 10. Deliveries to new destinations racing Stop are answered, including
// those held while their batcher's spawn waits in the supervisor's mailbox.
func TestFirstDeliveriesRacingStopAreAnswered(t *testing.T) {
	for round := range 5 {
		system := quietSystem()
		inst, err := actors.Start(system, actors.Config{Name: "race"})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var returned atomic.Int64
		const n = 300
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := fakecodec.New(fmt.Sprint("q", round, "-", i), lim10)
				c.Tune = codec.Tuning{Linger: time.Millisecond}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_, err := inst.Deliver(ctx, c, msg("a", "", "x"))
				if err != nil {
					assert.ErrorIs(t, err, messages.ErrStopped)
				}
				returned.Add(1)
			}()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, inst.Stop(ctx))
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: %d of %d callers unanswered 5s after Stop", round, n-returned.Load(), n)
		}
		assert.Equal(t, actors.Stats{}, inst.Stats())
		system.Shutdown()
	}
}

// 11. When a bisection's first half fails an entry of a group retryably,
// that group's later entries in the second half are not sent (the caller
// will retry the earlier one first), and are answered retryably.
func TestBisectionHoldsAGroupAfterARetryableFailure(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "bisect"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 3, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Hour, MaxInflight: 1}
	var sent sync.Map
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			if string(m.Body) == "poison" {
				return nil, fmt.Errorf("bad body: %w", codec.ErrRefused)
			}
			if string(m.Body) == "g1" {
				res[i].Err = &codec.EntryError{Code: "ServiceUnavailable"}
				continue
			}
			sent.Store(string(m.Body), true)
			res[i].ID = string(m.Body)
		}
		return res, nil
	}
	g1 := deliverAsync(inst, c, msg("a", "G", "g1"), 10*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 5*time.Second, time.Millisecond)
	poison := deliverAsync(inst, c, msg("b", "", "poison"), 10*time.Second)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, 5*time.Second, time.Millisecond)
	g2 := deliverAsync(inst, c, msg("a", "G", "g2"), 10*time.Second)

	r1, rp, r2 := await(t, g1), await(t, poison), await(t, g2)
	require.Error(t, r1.err)
	assert.False(t, codec.IsPermanent(r1.err))
	assert.True(t, codec.IsPermanent(rp.err), "the refused message alone: %v", rp.err)
	require.Error(t, r2.err, "g2 would be stored before g1, which its caller retries")
	assert.False(t, codec.IsPermanent(r2.err))
	_, stored := sent.Load("g2")
	assert.False(t, stored)
}

// 12. Every error a delivery can be answered with that retrying cannot mend
// is permanent, so a caller following the error catalogue (package messages) stops.
func TestErrorsThatRetryingCannotMendArePermanent(t *testing.T) {
	for _, err := range []error{messages.ErrNilCodec, actors.ErrNilContext, codec.Permanent(errors.New("x"))} {
		assert.True(t, codec.IsPermanent(err), "%v", err)
	}
	for _, err := range []error{messages.ErrStopped, messages.ErrBatcherDown, &messages.RetryAfterError{}, &messages.GroupPausedError{Group: "g"}, codec.ErrResultCount, codec.ErrCodecPanic, codec.ErrThrottled} {
		assert.False(t, codec.IsPermanent(err), "%v", err)
	}
}
