// Package testinst starts sinkbatch instances for tests: a quiet actor system
// and an instance that is stopped, and checked, when the test ends.
package testinst

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
)

// System is an actor system whose own logs are discarded.
func System() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

// Start runs an instance for one test or benchmark. When it ends, the
// instance must stop within 10 s with every delivery answered and its
// counters back at zero; then the system shuts down.
func Start(t testing.TB, cfg actors.Config) (*actor.ActorSystem, *actors.Instance) {
	t.Helper()
	system := System()
	inst, err := actors.Start(system, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, inst.Stop(ctx))
		require.Equal(t, actors.Stats{}, inst.Stats())
		system.Shutdown()
	})
	return system, inst
}
