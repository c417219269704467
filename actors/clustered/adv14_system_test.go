//go:build !race

package clustered_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// New refuses an Instance started in another actor system than the one it
// is given. Before, New took it, and the grain handed every delivery to
// the instance's PID through the node's system, where no such process
// runs: each delivery waited out its caller's whole deadline and ended
// ErrUnreachable, nothing was sent, and Leave then failed waiting for
// answers that never came.
func TestAdv14InstanceOfAnotherSystemIsRefused(t *testing.T) {
	newSystem := func() *actor.ActorSystem {
		return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	}
	other, system := newSystem(), newSystem()
	inst, err := actors.Start(other, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, inst.Stop(context.Background())) })
	require.Same(t, other, inst.System())
	dests := clustered.Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}

	_, err = clustered.New(system, clustered.Config{Instance: inst, Destinations: dests, Logger: quiet()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another actor system")

	// The same instance is taken in its own system, and nothing of the
	// refused New is left there (its endpoint is free).
	n, err := clustered.New(other, clustered.Config{Instance: inst, Destinations: dests, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, n.Leave(context.Background()), "a node never attached leaves at once")
}

// Attach refuses a cluster whose kind of the node's name is not the node's
// own (a kind made by hand, or another node's): its grains would not be
// this node's. Before, Attach took it, and each grain then ran another
// node's code, or none of sinkbatch's.
func TestAdv14AttachRefusesAForeignKind(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, inst.Stop(context.Background())) })
	dests := clustered.Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}
	n, err := clustered.New(system, clustered.Config{Instance: inst, Destinations: dests, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, n.Leave(context.Background())) })
	foreign := cluster.NewKind(clustered.Kind, actor.PropsFromFunc(func(actor.Context) {}))
	c := cluster.New(system, cluster.Configure("sinkbatch-test", test.NewTestProvider(test.NewInMemAgent()), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(foreign)))
	err = n.Attach(c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not this node's")
}

// Attach refuses a node that has left: its grains would yield at once, and
// no later Leave would shut the cluster down. Before, Attach took it.
func TestAdv14AttachAfterLeaveIsRefused(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, inst.Stop(context.Background())) })
	dests := clustered.Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}
	n, err := clustered.New(system, clustered.Config{Instance: inst, Destinations: dests, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, n.Leave(context.Background()))
	c := cluster.New(system, cluster.Configure("sinkbatch-test", test.NewTestProvider(test.NewInMemAgent()), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(n.Kind())))
	err = n.Attach(c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has left")
}
