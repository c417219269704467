package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
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
)

// A Deliver whose ctx has no deadline gives up at DefaultTimeout when its
// batcher cannot answer (a codec stuck in Size), counted from its own
// start: its reply process's timer, left armed by an earlier call, fires
// first at that call's deadline and must not end this one then.
func TestDeliverGivesUpAtDefaultTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	_, inst := start(t, actors.Config{Name: "timeout", DefaultTimeout: timeout})
	lim := codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20}
	slow := fakecodec.New("slow", lim)
	slow.Latency = timeout / 2
	stuck := fakecodec.New("stuck", lim)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before Stop, which the start cleanup runs
	stuck.SizeHook = func(m codec.Message) int {
		<-release
		return len(m.Body)
	}
	msg := codec.Message{Tenant: "t", Body: []byte("x")}

	// One caller at a time: each call takes the same reply process.
	_, err := inst.Deliver(context.Background(), slow, msg)
	require.NoError(t, err)
	for range 2 {
		began := time.Now()
		_, err := inst.Deliver(context.Background(), stuck, msg)
		took := time.Since(began)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "DefaultTimeout")
		assert.GreaterOrEqual(t, took, timeout)
		assert.Less(t, took, 20*timeout, "the timer must end the call")
	}
}

// hangSlack is how late past its bound an answer may come on a loaded
// machine (two cores shared with other tests); it catches hangs, it does not
// measure speed.
const hangSlack = 2 * time.Second

// Calls of every kind back to back on the instance's pooled reply
// processes: no-deadline calls (a ctx that never ends, and a cancellable
// one) to a destination that never answers (stuck in SendBatch or in Size)
// end at their own DefaultTimeout,
// never earlier and never much later, whatever deadline the call before
// them on the same reply process had; calls with a deadline end at it;
// calls to a destination that answers get their own message's id.
func TestDefaultTimeoutMixedOnPooledWaiters(t *testing.T) {
	const (
		timeout = 50 * time.Millisecond
		callers = 6
	)
	rounds := 25
	if testing.Short() {
		rounds = 8
	}
	_, inst := start(t, actors.Config{Name: "timeout", DefaultTimeout: timeout})
	lim := codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}
	silent, release := silentCodec(t, lim)
	// stuck never gets past Size: only the reply process's timer ends a
	// no-deadline call to it.
	stuck := fakecodec.New("stuck", lim)
	stuck.SizeHook = func(m codec.Message) int {
		<-release
		return len(m.Body)
	}
	echo := fakecodec.New("echo", lim)
	echo.Hook = echoIDs

	type kind int
	const (
		noDeadline  kind = iota // context.Background: waits on its answer alone
		cancellable             // no deadline, but a Done channel
		deadline                // a deadline shorter or longer than DefaultTimeout
		answered                // the destination answers
	)
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				body := fmt.Sprintf("c%d-%d", g, i)
				msg := codec.Message{Tenant: "t", Body: []byte(body)}
				k := kind(rand.IntN(4))
				dest := silent
				if rand.IntN(2) == 0 {
					dest = stuck
				}
				began := time.Now()
				switch k {
				case noDeadline, cancellable:
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if k == cancellable {
						ctx, cancel = context.WithCancel(ctx)
					}
					_, err := inst.Deliver(ctx, dest, msg)
					took := time.Since(began)
					cancel()
					assert.ErrorIs(t, err, context.DeadlineExceeded, "kind %d", k)
					assert.GreaterOrEqual(t, took, timeout, "kind %d ended before its DefaultTimeout", k)
					assert.Less(t, took, timeout+hangSlack, "kind %d outlived its DefaultTimeout", k)
				case deadline:
					d := time.Duration(10+rand.IntN(80)) * time.Millisecond
					ctx, cancel := context.WithTimeout(context.Background(), d)
					_, err := inst.Deliver(ctx, dest, msg)
					took := time.Since(began)
					cancel()
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.GreaterOrEqual(t, took, d, "a call with a deadline ended before it")
					assert.Less(t, took, d+hangSlack)
				case answered:
					// A deadline of its own: DefaultTimeout (50 ms) is
					// shorter than a loaded machine's scheduling delay
					// under -race, which a call that is answered must
					// not depend on.
					ctx, cancel := context.WithTimeout(context.Background(), hangSlack)
					id, err := inst.Deliver(ctx, echo, msg)
					cancel()
					if assert.NoError(t, err) {
						assert.Equal(t, "id-"+body, id, "an answer carries its own message's result")
					}
				}
			}
		}()
	}
	wg.Wait()
}

// echoIDs is a fakecodec hook that answers each message with an id made of
// its body, so that a caller can tell its own answer from another's.
func echoIDs(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
	res := make([]codec.Result, len(batch))
	for i, m := range batch {
		res[i].ID = "id-" + string(m.Body)
	}
	return res, nil
}

// silentCodec is a destination that answers a request only when its
// context ends (the request's deadline is its latest caller's: an answer
// then is no earlier than that caller's own) or the test does, which
// closes the channel it returns.
func silentCodec(t *testing.T, lim codec.Limits) (*fakecodec.Codec, <-chan struct{}) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before Stop, which start's cleanup runs
	c := fakecodec.New("silent", lim)
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		select {
		case <-release:
			return nil, context.Canceled
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c, release
}

// neverDone is a ctx with no deadline whose Done channel is not nil but
// never closes: Deliver must not wait on it alone.
type neverDone struct{ context.Context }

var neverClosed = make(chan struct{})

func (neverDone) Done() <-chan struct{} { return neverClosed }

// lying is a ctx that reports a deadline but whose Done never closes: the
// batcher must answer its call at that deadline all the same.
type lying struct {
	context.Context
	at time.Time
}

func (l lying) Deadline() (time.Time, bool) { return l.at, true }
func (lying) Done() <-chan struct{}         { return neverClosed }

// Thousands of callers, each making calls back to back on the instance's
// pooled reply processes, with every kind of ctx: none (DefaultTimeout),
// one whose Done never closes, a deadline, a deadline whose Done never
// closes (the batcher's answer at the deadline is all that ends it), and a
// ctx the destination cancels exactly as it answers; to a destination that
// answers, one that never does, and one that cancels its caller's ctx as it
// answers. Stop comes at a random moment in the middle of it all.
//
// Every call returns, within its bound plus a slack that only catches
// hangs; a call that returns nil has its own message's id (a stale answer
// left on a reply process by an abandoned call would be another's); every
// error is one its call may get; a call to the silent destination never
// ends before its bound.
func TestThousandsOfCallersMixedDeadlinesWhileStopping(t *testing.T) {
	const (
		timeout = 250 * time.Millisecond
		slack   = 5 * time.Second
		hang    = 90 * time.Second
	)
	callers, each := 2000, 5
	if testing.Short() {
		callers = 300
	}
	system := testinst.System()
	t.Cleanup(system.Shutdown)
	inst, err := actors.Start(system, actors.Config{Name: "waiter", DefaultTimeout: timeout})
	require.NoError(t, err)

	lim := codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}
	echo := fakecodec.New("echo", lim)
	echo.Hook = echoIDs
	echo.Tune = codec.Tuning{Linger: time.Millisecond}
	var cancels sync.Map // body -> context.CancelFunc
	canceller := fakecodec.New("canceller", lim)
	canceller.Tune = codec.Tuning{Linger: time.Millisecond}
	canceller.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		for _, m := range batch {
			if c, ok := cancels.Load(string(m.Body)); ok {
				c.(context.CancelFunc)()
			}
		}
		return echoIDs(ctx, batch)
	}
	silent := fakecodec.New("silent", lim)
	silent.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}

	type kind int
	const (
		background kind = iota
		never
		withDeadline
		liar
		cancelAtAnswer
		kinds
	)
	var (
		calls, done, ok, stopped, expired, cancelled atomic.Int64
		stopAt                                       = int64(callers * each * (2 + rand.IntN(5)) / 10)
		stopOnce                                     sync.Once
		stopErr                                      = make(chan error, 1)
	)
	stop := func() {
		stopOnce.Do(func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(300))*time.Millisecond)
				defer cancel()
				stopErr <- inst.Stop(ctx)
			}()
		})
	}
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				calls.Add(1)
				body := fmt.Sprintf("c%d-%d", g, i)
				msg := codec.Message{Tenant: fmt.Sprint("t", g%7), Body: []byte(body)}
				k := kind(rand.IntN(int(kinds)))
				dest := echo
				switch {
				case k == cancelAtAnswer:
					dest = canceller
				case rand.IntN(3) == 0:
					dest = silent
				}
				bound := timeout
				var ctx context.Context
				cancel := context.CancelFunc(func() {})
				switch k {
				case background:
					ctx = context.Background()
				case never:
					ctx = neverDone{context.Background()}
				case withDeadline:
					bound = time.Duration(1+rand.IntN(300)) * time.Millisecond
					ctx, cancel = context.WithTimeout(context.Background(), bound)
				case liar:
					bound = time.Duration(1+rand.IntN(300)) * time.Millisecond
					ctx = lying{context.Background(), time.Now().Add(bound)}
				case cancelAtAnswer: // no deadline: DefaultTimeout
					ctx, cancel = context.WithCancel(context.Background())
					cancels.Store(body, cancel)
				}
				began := time.Now()
				id, err := inst.Deliver(ctx, dest, msg)
				took := time.Since(began)
				cancel()
				cancels.Delete(body)
				if done.Add(1) == stopAt {
					stop()
				}
				assert.Less(t, took, bound+slack, "call %s (kind %d to %s) outlived its bound %v", body, k, dest.ID, bound)
				switch {
				case err == nil:
					ok.Add(1)
					assert.NotEqual(t, silent, dest, "the silent destination answered")
					assert.Equal(t, "id-"+body, id, "call %s got another call's answer", body)
				case errors.Is(err, messages.ErrStopped):
					stopped.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					expired.Add(1)
					if dl, has := ctx.Deadline(); dest == silent && has {
						assert.False(t, time.Now().Before(dl), "call %s (kind %d) ended before its deadline", body, k)
					} else if dest == silent {
						assert.GreaterOrEqual(t, took, bound, "call %s (kind %d) ended before its DefaultTimeout", body, k)
					}
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
					assert.Equal(t, cancelAtAnswer, k, "%s: %v", body, err)
				default:
					assert.Fail(t, "unexpected answer", "call %s (kind %d to %s): %v", body, k, dest.ID, err)
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	// Stats, read from any goroutine while all of it runs, never shows a
	// negative count, more batchers than destinations, or more requests
	// in flight than their MaxInflight allows (SinkConcurrency, 8, each).
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-finished:
				return
			default:
			}
			st := inst.Stats()
			if st.Batchers < 0 || st.Queued < 0 || st.QueuedBytes < 0 || st.InFlight < 0 || st.Waiting < 0 ||
				st.Batchers > 3 || st.InFlight > 3*actors.DefaultSinkConcurrency {
				assert.Fail(t, "Stats out of bounds", "%+v", st)
				return
			}
			runtime.Gosched()
		}
	}()
	select {
	case <-finished:
	case <-time.After(hang):
		require.FailNow(t, "callers hang", "%d calls made, %d ok, %d stopped, %d expired, %d cancelled", calls.Load(), ok.Load(), stopped.Load(), expired.Load(), cancelled.Load())
	}
	<-polled
	stop() // if the callers ended before stopAt
	var first error
	select {
	case first = <-stopErr:
		if first != nil {
			assert.ErrorIs(t, first, context.DeadlineExceeded, "Stop's error wraps its ctx's")
		}
	case <-time.After(hang):
		require.FailNow(t, "Stop hangs")
	}
	assert.Equal(t, first, inst.Stop(context.Background()), "a later Stop waits for the first and returns its error")
	assert.Equal(t, actors.Stats{}, inst.Stats(), "nothing left behind")
	total := int64(callers * each)
	assert.Equal(t, total, ok.Load()+stopped.Load()+expired.Load()+cancelled.Load())
	assert.Positive(t, ok.Load())
	assert.Positive(t, stopped.Load())
	t.Logf("%d calls: %d ok, %d stopped, %d deadline, %d cancelled at the answer", total, ok.Load(), stopped.Load(), expired.Load(), cancelled.Load())
}

// replyProcesses counts the instance's reply processes (its waiters) that
// are registered in system.
func replyProcesses(system *actor.ActorSystem, name string) int {
	prefix := "sinkbatch-" + name + "$reply"
	n := 0
	for _, shard := range system.ProcessRegistry.LocalPIDs.LocalPIDs {
		for _, k := range shard.Keys() {
			if strings.HasPrefix(k, prefix) {
				n++
			}
		}
	}
	return n
}

// The waiters Deliver calls wait on are pooled in a sync.Pool, which a
// collection empties, with every pooled waiter also kept in a list that
// takes the dropped ones back. Attacked here: callers of every kind (a
// ctx that never ends, one cancelled at a random moment, a deadline) in
// waves, with collections forced all the while, so that waiters are
// dropped by the pool while calls hold them, taken back from the list,
// and put back twice into the pool; then Stop in the middle of a wave.
// Every caller gets its own message's answer or its ctx's error (ErrStopped
// once Stop is called; nothing is sent of a call made after it returned),
// never another's; while the instance runs, the reply
// processes never outnumber the most callers at once; after Stop, none is
// left registered, and none is made for a call after it.
func TestPooledWaitersUnderCollectionsAndStop(t *testing.T) {
	const (
		name    = "pool"
		callers = 600
		waves   = 4
	)
	system, inst := start(t, actors.Config{Name: name, DefaultTimeout: 200 * time.Millisecond})
	echo := fakecodec.New("echo", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	echo.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		if rand.IntN(3) == 0 {
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		}
		return echoIDs(ctx, batch)
	}

	collecting := make(chan struct{})
	var collector sync.WaitGroup
	collector.Add(1)
	go func() {
		defer collector.Done()
		for {
			select {
			case <-collecting:
				return
			case <-time.After(time.Millisecond):
				runtime.GC()
			}
		}
	}()
	defer func() {
		close(collecting)
		collector.Wait()
	}()

	// stopping: Stop is about to be called or runs; stopped: it returned.
	var stopping, stopped atomic.Bool
	wave := func(w int) {
		var wg sync.WaitGroup
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf("w%d-c%d", w, c)
				var (
					ctx    = context.Background()
					cancel = context.CancelFunc(func() {})
				)
				switch rand.IntN(3) {
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
				case 2:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(1+rand.IntN(3000))*time.Microsecond)
				}
				defer cancel()
				stoppedBefore := stopped.Load()
				id, err := inst.Deliver(ctx, echo, codec.Message{Tenant: fmt.Sprint("t", c%5), Body: []byte(body)})
				switch {
				case err == nil:
					assert.Equal(t, "id-"+body, id, "a caller got another's answer")
					assert.False(t, stoppedBefore, "a call made after Stop returned was sent")
				case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
				case errors.Is(err, messages.ErrStopped):
					assert.True(t, stopping.Load(), "ErrStopped before Stop")
				default:
					t.Errorf("%s: unexpected %v", body, err)
				}
			}()
		}
		done := make(chan struct{})
		go func() {
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			// A caller left waiting (two calls on one waiter, one of
			// them never answered) must fail, not hang the run.
			t.Errorf("callers of wave %d still wait after 30 s", w)
		}
	}
	for w := range waves {
		wave(w)
		assert.LessOrEqual(t, replyProcesses(system, name), callers, "more reply processes than callers at once, after wave %d", w)
	}
	require.Positive(t, replyProcesses(system, name), "the waiters are pooled between calls")

	// The last wave meets Stop halfway.
	var last sync.WaitGroup
	last.Add(1)
	go func() {
		defer last.Done()
		wave(waves)
	}()
	time.Sleep(2 * time.Millisecond)
	stopping.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, inst.Stop(ctx))
	stopped.Store(true)
	last.Wait()
	wave(waves + 1) // after Stop: all ErrStopped, no waiter kept
	assert.Zero(t, replyProcesses(system, name), "reply processes left registered after Stop")
}
