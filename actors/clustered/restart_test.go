//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A member that crashes and comes back at the same address (a process
// restarted on a fixed host and port) is a new caller: the answers the
// owner still sends to its address for the deliveries of the one that
// crashed are not taken for its own. Before, a restarted member numbered
// its calls from 1 again, and took an answer meant for its predecessor's
// call n as the answer to its own call n: its caller was told another
// message's id (and its own message's answer, arriving later, was dropped).
func TestAMemberRestartedAtItsAddressIsNotAnsweredForItsPredecessor(t *testing.T) {
	const latency = 3 * time.Second
	var oldAnswered atomic.Int64 // when the owner's last request of old messages ended (unix ns)
	newCodec := func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Latency, c.Tune = latency, codec.Tuning{MaxInflight: 64, Linger: time.Millisecond}
		// Each message's id names it.
		c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				res[i].ID = "id-" + string(m.Body)
				if strings.HasPrefix(string(m.Body), "old-") {
					oldAnswered.Store(time.Now().UnixNano())
				}
			}
			return res, nil
		}
		return c
	}
	pool := names(16)
	agent := test.NewInMemAgent()
	provider := func() *test.Provider {
		return test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
	}
	owner := startMember(t, pool, memberOpts{provider: provider(), codec: newCodec})
	port := freePort(t)
	first := startMember(t, pool, memberOpts{provider: provider(), codec: newCodec, port: port, noCleanup: true})
	waitMembers(t, []*member{owner, first}, 2)
	var dest string
	for _, name := range pool {
		if o, _ := ownerOf(t, []*member{owner, first}, name); o == owner {
			dest = name
			break
		}
	}
	require.NotEmpty(t, dest, "the owner owns none of the destinations")

	// deliverMany makes n deliveries from m at once, each checking that its
	// answer names its own message; it returns at once, and done ends
	// once every delivery is answered.
	var mu sync.Mutex
	var wrong []string
	deliverMany := func(m *member, prefix string, n int, check bool) (done func()) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 4*latency)
				defer cancel()
				body := fmt.Sprintf("%s-%d", prefix, i)
				id, err := m.node.Deliver(ctx, dest, codec.Message{Body: []byte(body)})
				if check && (err != nil || id != "id-"+body) {
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("%s answered %q, %v", body, id, err))
					mu.Unlock()
				}
			}()
		}
		return wg.Wait
	}

	// The first incarnation's deliveries are in flight at the owner when
	// it crashes; the owner answers them after latency, to its address.
	deliverMany(first, "old", 60, false)
	require.Eventually(t, func() bool { return owner.fake(dest).Requests() >= 6 }, latency/2, 5*time.Millisecond,
		"the first incarnation's deliveries are not in flight at the owner")
	first.crash(t)
	_ = first.cluster.Config.ClusterProvider.Shutdown(true)

	// The restarted member, at the same address, delivers while those
	// answers are on their way.
	crashed := time.Now()
	second := startMember(t, pool, memberOpts{provider: provider(), codec: newCodec, port: port})
	waitMembers(t, []*member{owner, second}, 2)
	require.Less(t, time.Since(crashed), latency/2, "the restarted member joined too late for the test")
	newSent := time.Now()
	deliverMany(second, "new", 60, true)()
	// The test drove what it means to: the predecessor's answers were on
	// their way while the new member's deliveries waited for theirs.
	assert.True(t, newSent.Before(time.Unix(0, oldAnswered.Load())), "the predecessor's deliveries were answered before the new member delivered")
	assert.Empty(t, wrong, "a restarted member's callers were answered for another message")
}
