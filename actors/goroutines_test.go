package actors_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// A batcher's mailbox runs on a goroutine that waits for its next message
// while the batcher holds something; once it holds nothing (every delivery
// answered), stops idle or is stopped, no goroutine of it is left.
func TestABatcherHoldingNothingKeepsNoGoroutine(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "goroutines"})
	before := goleak.IgnoreCurrent()
	deliver := func(c codec.Codec) {
		for range 50 {
			_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "t", Body: []byte("x")})
			require.NoError(t, err)
		}
	}

	idle := fakecodec.New("idle", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	idle.Tune = codec.Tuning{IdleTimeout: 20 * time.Millisecond, Linger: time.Millisecond}
	deliver(idle)
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 10*time.Second, 5*time.Millisecond,
		"the batcher stops idle")
	goleak.VerifyNone(t, before)

	busy := fakecodec.New("busy", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	busy.Tune = codec.Tuning{Linger: time.Millisecond} // IdleTimeout: a minute
	deliver(busy)
	require.Equal(t, 1, inst.Stats().Batchers)
	// Every delivery is answered: the batcher lives and holds nothing.
	goleak.VerifyNone(t, before)
	deliver(busy)
	require.NoError(t, inst.Stop(context.Background()))
	goleak.VerifyNone(t, before)
}

// While one request holds the batcher busy, rounds of callers make its
// mailbox empty and wake again and again: a message posted as a run ends
// schedules the mailbox before the goroutine that ran it waits for the next
// run. Once every delivery is answered the batcher holds nothing, and none
// of the goroutines that ran its mailbox may stay (doc: a destination gone
// quiet keeps no goroutine for its IdleTimeout).
func TestAQuietBatcherKeepsNoMailboxGoroutineAfterBusyRounds(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "mailbox-mailbox"})
	before := goleak.IgnoreCurrent()
	c := fakecodec.New("plugged", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 2} // IdleTimeout: a minute
	plug := make(chan struct{})
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		if batch[0].Tenant == "plug" {
			<-plug
		}
		return make([]codec.Result, len(batch)), nil
	}
	plugged := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "plug", Body: []byte("x")})
		plugged <- err
	}()
	require.Eventually(t, func() bool { return inst.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)

	for range 50 {
		var wg sync.WaitGroup
		errs := make(chan error, 32*5)
		for range 32 {
			wg.Go(func() {
				for range 5 {
					_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "t", Body: []byte("x")})
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	close(plug)
	require.NoError(t, <-plugged)
	require.Equal(t, 1, inst.Stats().Batchers)
	goleak.VerifyNone(t, before)
}

// Stop whose ctx ends while the batcher's mailbox goroutine waits for its
// next run (a request holds the only slot; deliveries queue behind it):
// Stop returns an error wrapping ctx.Err(), every caller is answered
// ErrStopped (the one in flight included: its request is cancelled), and no
// goroutine of the batcher is left.
func TestStopWithAShortCtxWhileTheMailboxWaits(t *testing.T) {
	system := quietSystem()
	defer system.Shutdown()
	before := goleak.IgnoreCurrent()
	inst, err := actors.Start(system, actors.Config{Name: "mailbox-stop"})
	require.NoError(t, err)
	c, v := valved("stuck", codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20}, codec.Tuning{MaxInflight: 1, Linger: time.Millisecond})
	defer v.Open()
	first := deliverBg(context.Background(), inst, c, codec.Message{Body: []byte("0")})
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 10*time.Second, time.Millisecond)
	var rest []<-chan error
	for i := range 20 {
		rest = append(rest, deliverBg(context.Background(), inst, c, codec.Message{Tenant: fmt.Sprint(i % 3), Body: []byte("x")}))
	}
	require.Eventually(t, func() bool { return inst.Stats().Queued == 20 }, 10*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = inst.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for _, ch := range append(rest, first) {
		assert.ErrorIs(t, <-ch, messages.ErrStopped)
	}
	assert.Empty(t, c.Sent(), "the valve never opened")
	assert.Equal(t, actors.Stats{}, inst.Stats())
	goleak.VerifyNone(t, before)
}

// A batcher that stops idle (IdleTimeout 1ms) while deliveries keep coming,
// spaced so that many arrive as it reports idle, stops and starts again:
// every delivery is answered with its own id, none waits for its deadline,
// and once they are all answered and the batcher has stopped idle, none of
// its goroutines is left.
func TestIdleStopRacesDeliveries(t *testing.T) {
	logs := &testinst.Buffer{}
	_, inst := start(t, actors.Config{Name: "mailbox-idle", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	before := goleak.IgnoreCurrent()
	c := fakecodec.New("idle-race", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{IdleTimeout: time.Millisecond, Linger: time.Millisecond}
	var wg sync.WaitGroup
	ids := make([][]string, 4)
	errs := make([][]error, 4)
	for k := range ids {
		wg.Go(func() {
			for i := range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint(k), Body: []byte(fmt.Sprintf("%d-%d", k, i))})
				cancel()
				ids[k], errs[k] = append(ids[k], id), append(errs[k], err)
				// Spread the deliveries around the idle reports (load
				// shape, not a wait for an outcome).
				time.Sleep(time.Duration((k*31+i*17)%50) * 100 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for k := range ids {
		for i, err := range errs[k] {
			require.NoError(t, err, "caller %d delivery %d", k, i)
			require.False(t, seen[ids[k][i]], "two callers got one id")
			seen[ids[k][i]] = true
		}
	}
	assert.Len(t, c.Sent(), 4*100)
	assert.Greater(t, logs.Count("batcher started"), 3, "the batcher stopped idle again and again")
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 10*time.Second, time.Millisecond)
	goleak.VerifyNone(t, before)
}

// panicInRefused is a Recorder whose Refused panics: a refusal restarts the
// batcher from its Receive while its mailbox goroutine last saw it hold
// something.
type panicInRefused struct{ recorder }

func (p *panicInRefused) Sink(string) telemetry.SinkRecorder { return p }
func (*panicInRefused) Refused(messages.FullReason)          { panic("Refused panics") }

// A panic in user code (the Recorder) while the batcher holds a request
// and a full queue: each caller is answered once (the refused one and the
// queued one ErrBatcherDown, the one in flight ErrBatcherDown as the
// restart answers it), the restarted batcher serves the next delivery,
// and once it holds nothing no goroutine of it is left.
func TestAPanicInTheRecorderLeavesNoMailboxGoroutine(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "mailbox-panic", Recorder: &panicInRefused{}})
	before := goleak.IgnoreCurrent()
	c, v := valved("panicky", codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20}, codec.Tuning{MaxInflight: 1, QueueMax: 1, Linger: time.Millisecond})
	first := deliverBg(context.Background(), inst, c, codec.Message{Body: []byte("0")})
	require.Eventually(t, func() bool { return v.entered.Load() == 1 }, 10*time.Second, time.Millisecond)
	queued := deliverBg(context.Background(), inst, c, codec.Message{Body: []byte("1")})
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, 10*time.Second, time.Millisecond)
	_, err := inst.Deliver(context.Background(), c, codec.Message{Body: []byte("2")})
	assert.ErrorIs(t, err, messages.ErrBatcherDown, "the refused delivery's Recorder call panicked")
	assert.ErrorIs(t, <-queued, messages.ErrBatcherDown)
	assert.ErrorIs(t, <-first, messages.ErrBatcherDown)
	v.Open()
	_, err = inst.Deliver(context.Background(), c, codec.Message{Body: []byte("3")})
	require.NoError(t, err, "the restarted batcher serves")
	require.Eventually(t, func() bool { return inst.Stats() == actors.Stats{Batchers: 1} }, 10*time.Second, time.Millisecond)
	goleak.VerifyNone(t, before)
}
