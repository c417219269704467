//go:build !race

package clustered_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/messages"
)

// grainOn activates destination's grain on m, whether or not m owns it, and
// returns its PID.
func grainOn(t *testing.T, m *member, destination string) *actor.PID {
	t.Helper()
	f := m.system.Root.RequestFuture(actor.NewPID(m.system.Address(), disthash.PartitionActivatorActorName),
		&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: destination, Kind: clustered.Kind}}, 5*time.Second)
	res, err := f.Result()
	require.NoError(t, err)
	return res.(*cluster.ActivationResponse).Pid
}

// A HandoffDone carries the pauses its member took from its instance, and
// they have no other copy. One that reaches a grain no longer waiting for
// it (the grain yields, or gave up on that member) has its pauses passed on
// to the destination's owner: paused there, on the owner's own grain, or
// sent on from a grain of a member that does not own the destination.
// Before, such a grain ignored it, and the groups were no longer paused
// anywhere: the next message of each was sent. (It takes a race: the old
// owner finishes its drain just as the grain that asked stops waiting.)
func TestPausesReachingAGrainThatNoLongerWaitsAreKept(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"x"}, memberOpts{codec: strictCodecs()})
	owner, other := ownerOf(t, ms, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := other.node.Deliver(ctx, "x", groupMsg("warm-up", "w"))
	require.NoError(t, err)
	done := func(group string) *clusterpb.HandoffDone {
		return &clusterpb.HandoffDone{Destination: "x", Member: "127.0.0.1:1", Paused: []*clusterpb.PausedGroup{
			{Group: group, Key: "k-" + group, LeftNanos: int64(20 * time.Second)},
		}}
	}
	// The owner's grain admits: it waits for nobody.
	owner.system.Root.Send(grainOn(t, owner, "x"), done("g"))
	// A grain on the other member, which does not own x, yields.
	other.system.Root.Send(grainOn(t, other, "x"), done("h"))
	for _, group := range []string{"g", "h"} {
		assert.Eventually(t, func() bool {
			paused, err := other.node.PausedGroups(ctx, "x")
			return err == nil && slices.Contains(paused, group)
		}, 5*time.Second, 20*time.Millisecond, "%s: the handed-over pause was lost", group)
		m := groupMsg("held", "held-"+group)
		m.Group = group
		_, err := other.node.Deliver(ctx, "x", m)
		var gp *messages.GroupPausedError
		if assert.ErrorAs(t, err, &gp, group) {
			assert.Equal(t, messages.GroupPausedError{Group: group, Key: "k-" + group}, messages.GroupPausedError{Group: gp.Group, Key: gp.Key})
		}
	}
	for _, m := range ms {
		for _, s := range m.fake("x").Sent() {
			assert.NotEqual(t, "held", string(s.Body), "a paused group's message was sent")
		}
	}
}
