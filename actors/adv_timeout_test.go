package actors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// advSlack is how late past its bound an answer may come on a loaded
// machine (two cores shared with other tests); it catches hangs, it does not
// measure speed.
const advSlack = 2 * time.Second

// Calls of every kind back to back on the instance's pooled reply
// processes: no-deadline calls (a ctx that never ends, and a cancellable
// one) to a destination that never answers (stuck in SendBatch or in Size)
// end at their own DefaultTimeout,
// never earlier and never much later, whatever deadline the call before
// them on the same reply process had; calls with a deadline end at it;
// calls to a destination that answers get their own message's id.
func TestAdvDefaultTimeoutMixedOnPooledWaiters(t *testing.T) {
	const (
		timeout = 50 * time.Millisecond
		callers = 6
	)
	rounds := 25
	if testing.Short() {
		rounds = 8
	}
	_, inst := start(t, actors.Config{Name: "advtimeout", DefaultTimeout: timeout})
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
					assert.Less(t, took, timeout+advSlack, "kind %d outlived its DefaultTimeout", k)
				case deadline:
					d := time.Duration(10+rand.IntN(80)) * time.Millisecond
					ctx, cancel := context.WithTimeout(context.Background(), d)
					_, err := inst.Deliver(ctx, dest, msg)
					took := time.Since(began)
					cancel()
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.GreaterOrEqual(t, took, d, "a call with a deadline ended before it")
					assert.Less(t, took, d+advSlack)
				case answered:
					id, err := inst.Deliver(context.Background(), echo, msg)
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
