package actors_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/actors"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.NewServer starts every service it emulates; its DynamoDB
		// TTL reaper has no stop (secrets_test.go uses kumo for SQS).
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"))
}

// quietSystem is an actor system whose own logs are discarded.
func quietSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

// start runs an instance for one test and stops it at the end, checking that
// Stop answers everything and leaves the counters at zero.
func start(t testing.TB, cfg actors.Config) (*actor.ActorSystem, *actors.Instance) {
	t.Helper()
	system := quietSystem()
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
