package chaos_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kumo.Server.Close stops the HTTP server but not the services
		// behind it; its DynamoDB emulator's TTL reaper runs on.
		goleak.IgnoreTopFunction("github.com/sivchari/kumo/internal/service/dynamodb.(*MemoryStorage).ttlReaper"),
		// Started by go.opencensus.io's init, which the Google client
		// libraries import; it runs for the life of the process.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}
