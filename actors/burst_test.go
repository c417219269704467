package actors_test

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// A burst the batcher finds waiting in its mailbox is queued without a
// look at the batch after each delivery, but the last one looks: the
// linger timer is armed although no message follows the burst, so the
// burst leaves after Linger.
func TestBurstInMailboxLeavesAfterLinger(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "burst"})
	const n = 200 // several times the deliveries handled in a row without a look
	c := fakecodec.New("burst", codec.Limits{MaxEntries: 1000, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 50 * time.Millisecond}
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	c.SizeHook = func(m codec.Message) int {
		first.Do(func() { close(entered); <-release })
		return len(m.Body)
	}
	send := func() *actor.Future {
		return system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "t", Body: []byte("x")}}, 10*time.Second)
	}
	futures := []*actor.Future{send()}
	<-entered // the batcher is in Size: what is sent now waits in its mailbox
	for range n - 1 {
		futures = append(futures, send())
	}
	close(release)
	for _, f := range futures {
		res, err := f.Result()
		require.NoError(t, err)
		require.NoError(t, res.(*messages.Delivered).Err)
	}
	// One request unless Linger ran out while the burst was handled (a
	// loaded machine): then that delivery's look sent what was queued.
	sent := 0
	for _, k := range c.BatchSizes() {
		sent += k
	}
	assert.Equal(t, n, sent)
}
