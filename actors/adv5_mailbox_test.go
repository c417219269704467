package actors_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// While one request holds the batcher busy, rounds of callers make its
// mailbox empty and wake again and again: a message posted as a run ends
// schedules the mailbox before the goroutine that ran it waits for the next
// run. Once every delivery is answered the batcher holds nothing, and none
// of the goroutines that ran its mailbox may stay (doc: a destination gone
// quiet keeps no goroutine for its IdleTimeout).
func TestAQuietBatcherKeepsNoMailboxGoroutineAfterBusyRounds(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "adv5-mailbox"})
	before := goleak.IgnoreCurrent()
	c := fakecodec.New("plugged", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 2} // IdleTimeout: a minute
	plug := make(chan struct{})
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		if batch[0].Tenant == "plug" {
			<-plug
		}
		return make([]codec.Result, len(batch)), nil
	}
	plugged := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "plug", Body: []byte("x")})
		plugged <- err
	}()
	require.Eventually(t, func() bool { return inst.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)

	for range 50 {
		var wg sync.WaitGroup
		errs := make(chan error, 32*5)
		for range 32 {
			wg.Go(func() {
				for range 5 {
					_, err := inst.Deliver(context.Background(), c, codec.Message{Tenant: "t", Body: []byte("x")})
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	close(plug)
	require.NoError(t, <-plugged)
	require.Equal(t, 1, inst.Stats().Batchers)
	goleak.VerifyNone(t, before)
}
