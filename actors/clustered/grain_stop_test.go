package clustered

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// TestADeliveryReachingAGrainAsItStopsIsAnswered: a delivery from another
// member's caller that is in a yielded grain's mailbox when its linger
// ends is answered "not the owner" (its caller looks again), not dropped
// with the mailbox as the grain stops; and the grain does stop.
func TestADeliveryReachingAGrainAsItStopsIsAnswered(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{})
	n, err := New(system, Config{Instance: inst, Destinations: Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, n.Leave(context.Background())) })
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &grain{n: n, destination: "d"} }))
	p, ok := system.ProcessRegistry.GetLocal(pid.Id)
	require.True(t, ok)
	stopped := actor.NewFuture(system, time.Minute)
	p.SendSystemMessage(pid, &actor.Watch{Watcher: stopped.PID()})

	// With its mailbox held, the grain yields, its linger ends, and a
	// delivery arrives behind that: what a caller whose delivery was on
	// its way as the linger ended sees.
	p.SendSystemMessage(pid, &actor.SuspendMailbox{})
	system.Root.Send(pid, yield{})
	system.Root.Send(pid, stopTick{})
	id, c := n.calls.beginDelivery(system.Address())
	require.NotZero(t, id)
	c.queued = false
	system.Root.RequestWithCustomSender(pid, &clusterpb.DeliverBatch{Requests: []*clusterpb.DeliverRequest{
		{Call: id, Body: []byte("m"), BudgetNanos: int64(time.Minute)},
	}}, n.answersTo())
	p.SendSystemMessage(pid, &actor.ResumeMailbox{})

	select {
	case a := <-c.answer:
		require.Equal(t, answered, a.outcome)
		require.True(t, a.reply.NotOwner, "answered %v", a.reply)
	case <-time.After(10 * time.Second):
		t.Fatal("the delivery in the mailbox of the stopping grain was never answered")
	}
	_, err = stopped.Result()
	require.NoError(t, err, "the grain did not stop")
}
