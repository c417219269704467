package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// A Deliver whose ctx has no deadline gives up at DefaultTimeout when its
// batcher cannot answer (a codec stuck in Size), counted from its own
// start: its reply process's timer, left armed by an earlier call, fires
// first at that call's deadline and must not end this one then.
func TestDeliverGivesUpAtDefaultTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	_, inst := start(t, actors.Config{Name: "timeout", DefaultTimeout: timeout})
	lim := codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20}
	slow := fakecodec.New("slow", lim)
	slow.Latency = timeout / 2
	stuck := fakecodec.New("stuck", lim)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before Stop, which the start cleanup runs
	stuck.SizeHook = func(m codec.Message) int {
		<-release
		return len(m.Body)
	}
	msg := codec.Message{Tenant: "t", Body: []byte("x")}

	// One caller at a time: each call takes the same reply process.
	_, err := inst.Deliver(context.Background(), slow, msg)
	require.NoError(t, err)
	for range 2 {
		began := time.Now()
		_, err := inst.Deliver(context.Background(), stuck, msg)
		took := time.Since(began)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "DefaultTimeout")
		assert.GreaterOrEqual(t, took, timeout)
		assert.Less(t, took, 20*timeout, "the timer must end the call")
	}
}
