package clustered_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// member is one cluster member of a test: its actor system, instance,
// node, cluster and codecs.
type member struct {
	system  *actor.ActorSystem
	inst    *actors.Instance
	node    *clustered.Node
	cluster *cluster.Cluster
	codecs  map[string]codec.Codec
	dests   clustered.Destinations // the map New was given, which stays the test's
	gone    bool
}

// quiet is a logger that discards everything, for protoactor's own logs.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// memberOpts shape a test member.
type memberOpts struct {
	provider cluster.ClusterProvider
	remote   []remote.ConfigOption
	host     string
	port     int // the remote's port; 0: any
	retries  int // the remote's MaxRetryCount (2 s each); 0: protoactor's default
	logger   *slog.Logger
	// noCleanup: the caller leaves the member (startTestCluster leaves
	// all of its members at once).
	noCleanup bool
	// codec builds this member's codec for a destination name.
	codec func(name string) codec.Codec
	// tracer, if set, makes the member's instance trace.
	tracer trace.TracerProvider
	// wire is the node's Config.MaxWireBytes.
	wire int
	// noLeases: the node answers no lease probe, as a member of a version
	// before leases.
	noLeases bool
}

// startMember starts one member whose destinations are names, each a fake
// codec, and leaves it at the end of the test unless the test did.
func startMember(t testing.TB, names []string, o memberOpts) *member {
	t.Helper()
	logger := o.logger
	if logger == nil {
		logger = quiet()
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	inst, err := actors.Start(system, actors.Config{Logger: quiet(), TracerProvider: o.tracer})
	require.NoError(t, err)
	m := &member{system: system, inst: inst, codecs: map[string]codec.Codec{}}
	dests := clustered.Destinations{}
	for _, name := range names {
		var c codec.Codec = fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		if o.codec != nil {
			c = o.codec(name)
		}
		m.codecs[name] = c
		dests[name] = c
	}
	m.dests = dests
	m.node, err = clustered.New(system, clustered.Config{Instance: inst, Destinations: dests, Logger: logger, MaxWireBytes: o.wire})
	require.NoError(t, err)
	if o.noLeases {
		m.node.AnswerNoLeaseProbes()
	}
	host := o.host
	if host == "" {
		host = "127.0.0.1"
	}
	// As the package doc advises: protoactor's default preallocates 16 MB
	// of pointers per connection, which every GC scans.
	rc := remote.Configure(host, o.port, append([]remote.ConfigOption{remote.WithEndpointWriterQueueSize(1 << 10)}, o.remote...)...)
	if o.retries > 0 {
		rc.MaxRetryCount = o.retries
	}
	cfg := cluster.Configure("sinkbatch-test", o.provider, disthash.New(), rc,
		cluster.WithKinds(m.node.Kind()))
	m.cluster = cluster.New(system, cfg)
	m.cluster.StartMember()
	require.NoError(t, m.node.Attach(m.cluster))
	if !o.noCleanup {
		t.Cleanup(func() { m.leave(t) })
	}
	return m
}

// leave makes m leave gracefully and stops its instance.
func (m *member) leave(t testing.TB) {
	t.Helper()
	if m.gone {
		return
	}
	m.gone = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assert.NoError(t, m.node.Leave(ctx))
	assert.NoError(t, m.inst.Stop(ctx))
}

// leaveAll makes every member that has not left leave, at once (a leave
// waits about two seconds in protoactor).
func leaveAll(t testing.TB, ms []*member) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.leave(t)
		}()
	}
	wg.Wait()
}

// startTestCluster starts n members with the in-process test provider.
func startTestCluster(t testing.TB, n int, names []string, o memberOpts) []*member {
	t.Helper()
	agent := test.NewInMemAgent()
	ms := make([]*member, n)
	for i := range ms {
		o := o
		o.provider = test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
		o.noCleanup = true
		ms[i] = startMember(t, names, o)
	}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, n)
	return ms
}

// waitMembers waits until every member of ms sees want members.
func waitMembers(t testing.TB, ms []*member, want int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, m := range ms {
			if m.gone {
				continue
			}
			if m.cluster.MemberList.Members().Len() != want {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "members do not see %d members", want)
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("dest-%d", i)
	}
	return out
}

// fake is m's codec for name, a fake.
func (m *member) fake(name string) *fakecodec.Codec { return m.codecs[name].(*fakecodec.Codec) }
