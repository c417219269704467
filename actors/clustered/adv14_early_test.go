//go:build !race

package clustered_test

import (
	"context"
	"fmt"
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

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A service that starts delivering as soon as New returns, before its
// member has started or attached (its goroutines race its own start-up),
// has those deliveries wait for the topology and then go through, each
// once, within their deadlines: none is lost, refused or answered
// ErrUnreachable because the member was not ready yet.
func TestAdv14DeliveriesBeforeAttachWaitForIt(t *testing.T) {
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

	const callers = 20
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, errs[i] = n.Deliver(ctx, "d", codec.Message{Body: []byte(fmt.Sprint(i))})
		}()
	}
	time.Sleep(200 * time.Millisecond) // the callers are waiting now
	cl := cluster.New(system, cluster.Configure("sinkbatch-test", test.NewTestProvider(test.NewInMemAgent()), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(n.Kind())))
	cl.StartMember()
	require.NoError(t, n.Attach(cl))
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "caller %d", i)
	}
	sent := map[string]int{}
	for _, m := range c.Sent() {
		sent[string(m.Body)]++
	}
	assert.Len(t, sent, callers, "each delivery sent")
	for body, k := range sent {
		assert.Equal(t, 1, k, "%s sent %d times", body, k)
	}
}
