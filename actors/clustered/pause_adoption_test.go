//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/messages"
)

// A grain that takes over a destination adopts the pauses the old owner
// handed over without waiting for them in its Receive: it goes on taking
// messages while its instance is slow to take the pauses, and admits
// nothing until they are in, so a delivery of a paused group that reached
// it meanwhile is answered *messages.GroupPausedError and not sent.
func TestAGrainAdoptingPausesKeepsReceivingAndAdmitsAfter(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	clustered.SetAdoptHook(func() {
		entered <- struct{}{}
		<-release
	})
	t.Cleanup(func() { clustered.SetAdoptHook(nil) })
	var released bool
	defer func() {
		if !released {
			close(release)
		}
	}()
	ms := startTestCluster(t, 2, []string{"x"}, memberOpts{codec: strictCodecs()})
	owner, other := ownerOf(t, ms, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The other member holds a pause of x's group g, as an old owner
	// would: its hand-off to the owner's grain carries it.
	require.NoError(t, other.inst.AdoptPausedGroups(ctx, other.codecs["x"],
		[]messages.PausedGroup{{Group: "g", Key: "k-failed", Left: 20 * time.Second}}))

	grain := grainOn(t, owner, "x")
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner's grain did not begin adopting the pause handed over")
	}

	// A delivery of g reaches the grain while the adoption is slow.
	held := owner.system.Root.RequestFuture(grain, &clusterpb.DeliverBatch{Destination: "x", Requests: []*clusterpb.DeliverRequest{
		{Call: 1, Tenant: "t", Group: "g", IdempotencyKey: "k-held", Body: []byte("held"), BudgetNanos: int64(20 * time.Second)},
	}}, 20*time.Second)
	// The grain's mailbox moves on: a message behind the delivery is
	// answered while the adoption still waits.
	_, err := owner.system.Root.RequestFuture(grain, &actor.Touch{}, 2*time.Second).Result()
	require.NoError(t, err, "the grain's Receive is blocked by the adoption")

	close(release)
	released = true
	answer, err := held.Result()
	require.NoError(t, err)
	replies, ok := answer.(*clusterpb.DeliverReplies)
	require.True(t, ok, "answer %T", answer)
	require.Len(t, replies.Replies, 1)
	r := replies.Replies[0]
	assert.False(t, r.NotOwner)
	if assert.NotNil(t, r.Error, "the delivery was admitted before the pause was in place") && assert.NotNil(t, r.Error.GroupPaused) {
		assert.Equal(t, "g", r.Error.GroupPaused.Group)
		assert.Equal(t, "k-failed", r.Error.GroupPaused.Key)
	}
	for _, m := range ms {
		for _, s := range m.fake("x").Sent() {
			assert.NotEqual(t, "held", string(s.Body), "a paused group's message was sent")
		}
	}
}
