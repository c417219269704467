package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A batcher's mailbox runs on a goroutine that waits for its next message
// while the batcher holds something; once it holds nothing (every delivery
// answered), stops idle or is stopped, no goroutine of it is left.
func TestABatcherHoldingNothingKeepsNoGoroutine(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "goroutines"})
	before := goleak.IgnoreCurrent()
	deliver := func(c codec.Codec) {
		for range 50 {
			_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "t", Body: []byte("x")})
			require.NoError(t, err)
		}
	}

	idle := fakecodec.New("idle", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	idle.Tune = codec.Tuning{IdleTimeout: 20 * time.Millisecond, Linger: time.Millisecond}
	deliver(idle)
	require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 10*time.Second, 5*time.Millisecond,
		"the batcher stops idle")
	goleak.VerifyNone(t, before)

	busy := fakecodec.New("busy", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	busy.Tune = codec.Tuning{Linger: time.Millisecond} // IdleTimeout: a minute
	deliver(busy)
	require.Equal(t, 1, inst.Stats().Batchers)
	// Every delivery is answered: the batcher lives and holds nothing.
	goleak.VerifyNone(t, before)
	deliver(busy)
	require.NoError(t, inst.Stop(context.Background()))
	goleak.VerifyNone(t, before)
}
