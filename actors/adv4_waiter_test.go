package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

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
func TestAdv4ThousandsOfCallersMixedDeadlinesWhileStopping(t *testing.T) {
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
	inst, err := actors.Start(system, actors.Config{Name: "adv4waiter", DefaultTimeout: timeout})
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
