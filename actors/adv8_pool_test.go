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
	"github.com/ankusa/sinkbatch/messages"
)

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
func TestAdv8PooledWaitersUnderCollectionsAndStop(t *testing.T) {
	const (
		name    = "advpool"
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
