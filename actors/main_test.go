package actors_test

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.NewServer starts every service it emulates; its DynamoDB
		// TTL reaper has no stop (secrets_test.go uses kumo for SQS).
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"))
}

// quietSystem is an actor system whose own logs are discarded.
func quietSystem() *actor.ActorSystem { return testinst.System() }

// start runs an instance for one test and stops it at the end, checking that
// Stop answers everything and leaves the counters at zero.
func start(t testing.TB, cfg actors.Config) (*actor.ActorSystem, *actors.Instance) {
	t.Helper()
	return testinst.Start(t, cfg)
}
