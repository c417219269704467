//go:build !race

package clustered_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// These tests attack gRPC's limit on the messages a member receives (4 MiB
// unless raised): above it the receiving member drops the connection, and
// every delivery and answer on it with it. Before the node kept under it,
// 40 callers delivering 200 KiB bodies from another member (SQS takes up
// to 256 KiB) all got ErrUnreachable.

// bigCodec succeeds with each message's body length as its id, or fails
// with an error text of errText bytes if the tenant says so.
func bigCodec(errText int) func(string) codec.Codec {
	return func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 32 << 20})
		c.Latency, c.Discard = time.Millisecond, true
		c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				if m.Tenant == "fail" {
					res[i].Err = codec.Permanent(errors.New(strings.Repeat("e", errText)))
					continue
				}
				res[i].ID = fmt.Sprint(len(m.Body))
			}
			return res, nil
		}
		return c
	}
}

// deliverAll has callers on from deliver each message of msgs to each of
// destinations, several times, and returns what went wrong.
func deliverAll(t *testing.T, from *member, destinations []string, msgs []codec.Message, callers, rounds int, check func(codec.Message, string, error) bool) []string {
	t.Helper()
	var mu sync.Mutex
	var wrong []string
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				d := destinations[(c+r)%len(destinations)]
				m := msgs[(c+r)%len(msgs)]
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := from.node.Deliver(ctx, d, m)
				cancel()
				if !check(m, id, err) {
					mu.Lock()
					if len(wrong) < 5 {
						wrong = append(wrong, fmt.Sprintf("%s, %d bytes: id %q, err %.200v", d, len(m.Body), id, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return wrong
}

func succeeded(m codec.Message, id string, err error) bool {
	return err == nil && id == fmt.Sprint(len(m.Body))
}

// Many large deliveries at once, to one destination and to several owned
// by one member (each with its own batches to that member, which
// protoactor's writer would put in one gRPC message): all succeed.
func TestLargeDeliveriesCrossTheWire(t *testing.T) {
	dests := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}
	ms := startTestCluster(t, 2, dests, memberOpts{codec: bigCodec(0)})
	// The destinations the second member owns, delivered to from the first.
	var owned []string
	var owner, from *member
	for _, d := range dests {
		o, other := ownerOf(t, ms, d)
		if owner == nil {
			owner, from = o, other
		}
		if o == owner {
			owned = append(owned, d)
		}
	}
	require.GreaterOrEqual(t, len(owned), 2, "the test needs a member owning two destinations")
	msgs := []codec.Message{
		{Body: bytes.Repeat([]byte("a"), 200<<10)},
		{Body: bytes.Repeat([]byte("b"), 1<<20)},
		{Body: []byte("small")},
	}
	wrong := deliverAll(t, from, owned[:1], msgs[:1], 40, 5, succeeded)
	assert.Empty(t, wrong, "to one destination")
	wrong = deliverAll(t, from, owned, msgs, 48, 4, succeeded)
	assert.Empty(t, wrong, "to %d destinations on one member", len(owned))
}

// Error texts of any length reach their callers, cut, with their kind.
func TestLongErrorTextsReachTheirCallers(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"dest"}, memberOpts{codec: bigCodec(3 << 20)})
	_, from := ownerOf(t, ms, "dest")
	wrong := deliverAll(t, from, []string{"dest"}, []codec.Message{{Tenant: "fail", Body: []byte("x")}}, 30, 3, func(_ codec.Message, _ string, err error) bool {
		return err != nil && codec.IsPermanent(err) && strings.HasPrefix(err.Error(), "eeee") && len(err.Error()) < 64<<10
	})
	assert.Empty(t, wrong)
}

// A message too large to cross between members is refused at once, the
// same way from every member, owner included; one that fits is delivered.
func TestTooLargeForTheWireIsRefusedAtOnce(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"dest"}, memberOpts{codec: bigCodec(0)})
	owner, other := ownerOf(t, ms, "dest")
	for _, m := range []*member{owner, other} {
		start := time.Now()
		_, err := m.node.Deliver(context.Background(), "dest", codec.Message{Body: make([]byte, 2<<20)})
		require.ErrorIs(t, err, codec.ErrTooLarge)
		assert.True(t, codec.IsPermanent(err), "%v", err)
		assert.Less(t, time.Since(start), time.Second, "refused at once")
		id, err := m.node.Deliver(context.Background(), "dest", codec.Message{Body: make([]byte, 2<<20-200)})
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(2<<20-200), id)
	}
	_, err := clustered.New(ms[0].system, clustered.Config{Instance: ms[0].inst, Destinations: clustered.Destinations{"x": bigCodec(0)("x")}, MaxWireBytes: 1000})
	require.ErrorContains(t, err, "MaxWireBytes")
}

// With every member's limit raised (ReceiveLimit, with TLS as the package
// doc advises) and MaxWireBytes set to it, larger messages cross.
func TestRaisedLimitCarriesLargerMessages(t *testing.T) {
	const limit = 24 << 20
	ca := newAuthority(t, "cluster")
	tlsOpts := clustered.TLSOptions(clustered.MutualTLS(ca.pool, ca.member(t, 2), "sinkbatch-cluster"))
	// ReceiveLimit before the TLS options, to show that neither replaces
	// the other.
	ms := startTestCluster(t, 2, []string{"dest"}, memberOpts{codec: bigCodec(0), wire: limit,
		remote: append([]remote.ConfigOption{clustered.ReceiveLimit(limit)}, tlsOpts...)})
	_, from := ownerOf(t, ms, "dest")
	wrong := deliverAll(t, from, []string{"dest"}, []codec.Message{{Body: make([]byte, 5<<20)}, {Body: make([]byte, 9<<20)}}, 4, 2, succeeded)
	assert.Empty(t, wrong)
}
