//go:build !race

package clustered_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// TestActorFormKeepsOneSendersOrder: one actor sends 300 *clustered.Deliver
// of one group without waiting, to a destination another member owns;
// pstest stores them in the order the actor sent them, as the local actor
// form would.
func TestActorFormKeepsOneSendersOrder(t *testing.T) {
	const n = 300
	w := newWatched(t, 0, "ordered")
	ms := startTestCluster(t, 2, []string{"ordered"}, memberOpts{codec: w.codecFor(t, codec.Tuning{Linger: time.Millisecond, MaxInflight: 4})})
	_, from := ownerOf(t, ms, "ordered")
	answers := make(chan *messages.Delivered, n)
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			for i := range n {
				ctx.Request(from.node.PID(), &clustered.Deliver{
					Destination: "ordered",
					Message:     codec.Message{Group: "g", Body: []byte(strconv.Itoa(i))},
					Deadline:    time.Now().Add(20 * time.Second),
					Ref:         i,
				})
			}
		case *messages.Delivered:
			answers <- m
		}
	})
	pid := from.system.Root.Spawn(props)
	defer from.system.Root.Stop(pid)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for range n {
		select {
		case a := <-answers:
			require.NoError(t, a.Err, "delivery %v", a.Ref)
		case <-timeout.C:
			t.Fatal("not every delivery was answered")
		}
	}
	var stored []int
	for _, m := range w.srv.Messages() {
		i, err := strconv.Atoi(string(m.Data))
		require.NoError(t, err)
		stored = append(stored, i)
	}
	require.Len(t, stored, n)
	outOfOrder := 0
	for i := 1; i < len(stored); i++ {
		if stored[i] < stored[i-1] {
			outOfOrder++
		}
	}
	assert.Zero(t, outOfOrder, "adjacent pairs stored out of the sender's order: %v", fmt.Sprint(stored[:min(len(stored), 40)]))
}
