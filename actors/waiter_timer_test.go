package actors

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/mono"
)

// A waiter's timer, left armed by a call that was answered before its
// deadline, fires while the next call on the same waiter is between bound and
// begin: expire then finds no call waiting, and the call must still be ended
// at its own deadline, for a Deliver whose ctx never ends waits on its answer
// alone. Each cycle runs calls answered at once for about a DefaultTimeout
// (the first leaves the timer armed), then one never answered, which must get
// errNoAnswer no earlier than its deadline and well before the hang bound.
func TestWaiterTimerFiringAtBeginEndsTheCall(t *testing.T) {
	const (
		timeout = 200 * time.Microsecond
		hang    = 2 * time.Second // an answer this late is a call no timer ends
		callers = 4
	)
	cycles := 2000
	if testing.Short() {
		cycles = 300
	}
	// The package's own test (testinst imports actors): a quiet system.
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	p := &waiters{system: system, prefix: "test$reply"}
	t.Cleanup(p.close)

	var wg sync.WaitGroup
	errs := make(chan string, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := p.get()
			defer p.put(w)
			var pid actor.PID
			for i := range cycles {
				// Calls answered at once, from first, leave the timer armed
				// for first's deadline; the call that is never answered
				// begins close to that deadline, when the timer fires.
				first := mono.Now()
				target := first + int64(timeout) + rand.Int64N(int64(timeout)/4) - int64(timeout)/8
				for {
					d := mono.Now() + int64(timeout)
					w.bound(d)
					w.begin(&pid, "nonhost")
					w.Answer(&pid, codec.Result{ID: "ok"})
					// Its deadline may pass before the answer on a loaded
					// machine: then the timer's errNoAnswer wins.
					r := <-w.answer
					if r.ID != "ok" && (r.Err != errNoAnswer || mono.Now() < d) {
						errs <- "answered call got neither its answer nor a timely errNoAnswer"
						return
					}
					if mono.Now() >= target {
						break
					}
				}
				began := time.Now()
				d := mono.Now() + int64(timeout)
				w.bound(d)
				// Deliver allocates its call's record between the two, and
				// its goroutine may be preempted there: let the timer's
				// goroutine run.
				runtime.Gosched()
				w.begin(&pid, "nonhost")
				hangs := time.NewTimer(hang)
				select {
				case r := <-w.answer:
					hangs.Stop()
					if r.Err != errNoAnswer {
						errs <- "unanswered call got something other than errNoAnswer"
						return
					}
					if now := mono.Now(); now < d {
						errs <- "errNoAnswer came before the call's deadline"
						return
					}
				case <-hangs.C:
					w.abandon(&pid)
					errs <- "call " + time.Since(began).String() + " past its start with no answer: its timer was lost (cycle " + strconv.Itoa(i) + ")"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		require.Fail(t, e)
	}
}
