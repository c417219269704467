package actors_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// reentrant is a Listener whose Listening asks the instance for its
// destination's paused groups, which takes the batcher's rules' lock. Were
// Listening called under that lock, the question would wait until Listening
// returned: each call gives it a second, and counts the times it waited
// that long.
type reentrant struct {
	inst     *actors.Instance
	c        codec.Codec
	asked    atomic.Int64
	blocked  atomic.Int64
	answered chan codec.Result
}

func (r *reentrant) Listening(*actor.PID) bool {
	r.asked.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = r.inst.PausedGroups(ctx, r.c)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		r.blocked.Add(1)
	}
	return true
}

func (r *reentrant) Answer(_ *actor.PID, res codec.Result) { r.answered <- res }

// The rules never call a caller's code under their lock: a Listener's
// Listening may call back into the instance (here PausedGroups, which takes
// that lock) wherever the batcher asks it, on arrival and before each
// request, and every delivery is sent and answered.
func TestListeningIsNeverAskedUnderTheRulesLock(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "reentrant"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 5 * time.Millisecond, StrictGroups: true, MaxInflight: 1}
	const n = 12
	r := &reentrant{inst: inst, c: c, answered: make(chan codec.Result, n)}
	for i := range n {
		m := msg("t", fmt.Sprint("g", i%3), fmt.Sprint(i))
		m.IdempotencyKey = fmt.Sprint("k", i)
		sendDirect(system, inst, c, m, r, "reentrant", uint32(i+1))
	}
	for range n {
		select {
		case res := <-r.answered:
			require.NoError(t, res.Err)
		case <-time.After(30 * time.Second):
			t.Fatal("not every delivery was answered")
		}
	}
	assert.GreaterOrEqual(t, r.asked.Load(), int64(2*n), "asked on arrival and before the request")
	assert.Zero(t, r.blocked.Load(), "Listening was asked under the rules' lock")
}
