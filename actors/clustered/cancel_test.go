//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A caller that cancels its ctx after its delivery reached the owner, but
// before the owner's batcher sent it, is not sent, as with a local
// instance: a caller on another member (its cancel travels to the grain)
// and a caller on the owner that admitted directly alike. Before, both
// were sent once the request in flight before them ended (the owner kept
// them until their deadlines). The delivery's count in the owner's ledger
// ends with it, so the owner still hands the destination off at once.
func TestCancelledDeliveryIsNotSent(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"dest"}, memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Latency, c.Tune = 500*time.Millisecond, codec.Tuning{MaxInflight: 1, Linger: time.Millisecond}
		return c
	}})
	owner, other := ownerOf(t, ms, "dest")
	ctx := context.Background()
	// Both members know the owner: their next deliveries take their
	// usual paths (the owner's directly, the other's to the grain).
	for _, m := range ms {
		_, err := m.node.Deliver(ctx, "dest", codec.Message{Body: []byte("warm-up")})
		require.NoError(t, err)
	}
	require.True(t, owner.node.OpenHere("dest"), "the owner's callers do not admit directly")

	deliver := func(m *member, body string, cancelAfter time.Duration) <-chan error {
		return deliverAsync(m, "dest", body, 10*time.Second, cancelAfter)
	}
	blocker := deliver(owner, "blocker", 0)
	time.Sleep(100 * time.Millisecond) // the blocker's request is in flight
	results := map[string]<-chan error{
		"remote-cancelled": deliver(other, "remote-cancelled", 200*time.Millisecond),
		"direct-cancelled": deliver(owner, "direct-cancelled", 200*time.Millisecond),
		"remote-kept":      deliver(other, "remote-kept", 0),
		"direct-kept":      deliver(owner, "direct-kept", 0),
	}
	require.NoError(t, <-blocker)
	for body, done := range results {
		err := <-done
		switch body {
		case "remote-cancelled", "direct-cancelled":
			assert.ErrorIs(t, err, context.Canceled, body)
			assert.ErrorIs(t, err, clustered.ErrUnreachable, body)
		default:
			assert.NoError(t, err, body)
		}
	}
	var sent []string
	for _, m := range owner.fake("dest").Sent() {
		sent = append(sent, string(m.Body))
	}
	assert.Contains(t, sent, "remote-kept")
	assert.Contains(t, sent, "direct-kept")
	assert.NotContains(t, sent, "remote-cancelled", "a cancelled delivery from another member was sent")
	assert.NotContains(t, sent, "direct-cancelled", "a cancelled direct delivery was sent")
	assert.Zero(t, owner.node.CancelsKept(), "the owner keeps the cancels of deliveries it dropped")

	// The ledger counted the dropped deliveries out: the owner leaves, and
	// hands the destination off, at once.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, owner.node.Leave(lctx))
	assert.Less(t, time.Since(start), 4*time.Second, "the owner's leave waited for the dropped deliveries")
	owner.gone = true
	require.NoError(t, owner.inst.Stop(lctx))
	_, err := other.node.Deliver(lctx, "dest", codec.Message{Body: []byte("after")})
	assert.NoError(t, err)
}

// deliverAsync delivers body from m to destination with a timeout, its
// ctx cancelled after cancelAfter if that is positive, and returns where
// its error will be.
func deliverAsync(m *member, destination, body string, timeout, cancelAfter time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if cancelAfter > 0 {
			time.AfterFunc(cancelAfter, cancel)
		}
		_, err := m.node.Deliver(ctx, destination, codec.Message{Body: []byte(body)})
		done <- err
	}()
	return done
}
