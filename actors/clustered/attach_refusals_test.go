//go:build !race

package clustered_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
func TestInstanceOfAnotherSystemIsRefused(t *testing.T) {
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

// unattached is a node on a new actor system with one destination, "d",
// and its instance, neither attached to a cluster; the test's end makes the
// node leave (if it has not) and stops the instance.
func unattached(t *testing.T) (*actor.ActorSystem, *clustered.Node, *fakecodec.Codec) {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet()})
	require.NoError(t, err)
	c := fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	n, err := clustered.New(system, clustered.Config{Instance: inst, Destinations: clustered.Destinations{"d": c}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, n.Leave(ctx))
		assert.NoError(t, inst.Stop(ctx))
	})
	return system, n, c
}

// testCluster is a cluster on system with the in-process provider and the
// given kinds, not started.
func testCluster(system *actor.ActorSystem, kinds ...*cluster.Kind) *cluster.Cluster {
	return cluster.New(system, cluster.Configure("sinkbatch-test", test.NewTestProvider(test.NewInMemAgent()), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(kinds...)))
}

// Attach refuses a cluster whose kind of the node's name is not the node's
// own (a kind made by hand, or another node's): its grains would not be
// this node's. Before, Attach took it, and each grain then ran another
// node's code, or none of sinkbatch's.
func TestAttachRefusesAForeignKind(t *testing.T) {
	system, n, _ := unattached(t)
	foreign := cluster.NewKind(clustered.Kind, actor.PropsFromFunc(func(actor.Context) {}))
	err := n.Attach(testCluster(system, foreign))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not this node's")
}

// Attach refuses a node that has left: its grains would yield at once, and
// no later Leave would shut the cluster down. Before, Attach took it.
func TestAttachAfterLeaveIsRefused(t *testing.T) {
	system, n, _ := unattached(t)
	require.NoError(t, n.Leave(context.Background()))
	err := n.Attach(testCluster(system, n.Kind()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has left")
}

// A second Leave, while the first still drains, returns when its own ctx
// ends, as a second Instance.Stop does; once the first is done, a later
// call returns the first's result at once. Before, every later call
// waited inside the first's sync.Once for all of it, whatever its own ctx.
func TestSecondLeaveKeepsItsOwnCtx(t *testing.T) {
	system, n, c := unattached(t)
	release := make(chan struct{})
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return make([]codec.Result, len(batch)), nil
	}
	cl := testCluster(system, n.Kind())
	cl.StartMember()
	require.NoError(t, n.Attach(cl))
	delivered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := n.Deliver(ctx, "d", codec.Message{Body: []byte("held")})
		delivered <- err
	}()
	require.Eventually(t, func() bool { return c.Requests() > 0 }, 5*time.Second, 5*time.Millisecond)

	first := make(chan error, 1)
	go func() { first <- n.Leave(context.Background()) }() // drains: waits for the held request
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := n.Leave(ctx)
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, took, 2*time.Second, "the second Leave waited for the first")

	close(release)
	require.NoError(t, <-delivered, "the held delivery was answered by the drain")
	require.NoError(t, <-first)
	require.NoError(t, n.Leave(ctx), "a call after the first ended returns its result, whatever its own ctx")
}
