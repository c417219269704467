package actors_test

import (
	"context"
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

// Instance.Stop: "the PID stays registered and answers later senders
// ErrStopped (a new instance of the same name takes it over)". An actor
// that holds the stopped instance's PID, and sent to it before, must reach
// the new instance once one of the same name has started, as a sender
// holding a fresh copy of the PID does. protoactor caches the process a
// PID value resolved to in the value itself, and drops the cache only for
// a dead ActorProcess, not for the instance's router.
func TestNewInstanceTakesOverTheOldPID(t *testing.T) {
	const within = 5 * time.Second
	system := testinst.System()
	t.Cleanup(system.Shutdown)
	c := fakecodec.New("takeover", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Hook = echoIDs
	ask := func(pid *actor.PID, body string) *messages.Delivered {
		t.Helper()
		d := &messages.Deliver{Codec: c, Message: codec.Message{Body: []byte(body)}, Deadline: time.Now().Add(within)}
		res, err := system.Root.RequestFuture(pid, d, within).Result()
		require.NoError(t, err, "%s: no answer", body)
		return res.(*messages.Delivered)
	}
	stop := func(inst *actors.Instance) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		require.NoError(t, inst.Stop(ctx))
	}

	first, err := actors.Start(system, actors.Config{Name: "takeover"})
	require.NoError(t, err)
	held := first.PID() // an actor keeps it, and sends through it
	require.NoError(t, ask(held, "before").Err)
	stop(first)
	assert.ErrorIs(t, ask(held, "between").Err, messages.ErrStopped, "the stopped instance's PID answers ErrStopped")

	second, err := actors.Start(system, actors.Config{Name: "takeover"})
	require.NoError(t, err)
	t.Cleanup(func() { stop(second) })
	fresh := &actor.PID{Address: held.Address, Id: held.Id}
	if dl := ask(fresh, "fresh"); assert.NoError(t, dl.Err, "a fresh copy of the PID reaches the new instance") {
		assert.Equal(t, "id-fresh", dl.ID)
	}
	if dl := ask(held, "after"); assert.NoError(t, dl.Err, "the PID the actor held still answers ErrStopped: the new instance did not take it over") {
		assert.Equal(t, "id-after", dl.ID)
	}
}
