//go:build !race

// Cluster members in one process make protoactor report data races inside
// itself under -race (see package clustered's tests); .ci/run runs this
// test without it.

package outbox_test

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
	"github.com/ankusa/sinkbatch/outbox"
)

func TestARelayDeliversThroughAClusterMember(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, true)
	const n = 2000
	copyRows(t, db, table, n, 16, 4, 8)

	quiet := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet})
	require.NoError(t, err)
	cs, closeCodecs, err := codecs(context.Background(), s.ps.Addr, s.kumo.URL, s.queueURL)
	require.NoError(t, err)
	defer closeCodecs()
	node, err := clustered.New(system, clustered.Config{Instance: inst, Destinations: cs, Logger: quiet})
	require.NoError(t, err)
	rc := remote.Configure("127.0.0.1", 0, remote.WithEndpointWriterQueueSize(1<<10))
	c := cluster.New(system, cluster.Configure("outbox-test",
		test.NewTestProvider(test.NewInMemAgent(), test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond)),
		disthash.New(), rc, cluster.WithKinds(node.Kind())))
	c.StartMember()
	require.NoError(t, node.Attach(c))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, node.Leave(ctx))
		assert.NoError(t, inst.Stop(ctx)) // Leave has shut the actor system down
	}()

	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: outbox.Cluster(node)})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, time.Minute)
	require.NoError(t, stop())
	v := check(t, append(published(s.ps), drainFIFO(t, s.kumo.URL, s.queueURL)...))
	assert.Len(t, v.distinct, n)
	assert.Zero(t, v.violations, "%v", v.examples)
	assert.Equal(t, int64(n), r.Stats().Sent)
}
