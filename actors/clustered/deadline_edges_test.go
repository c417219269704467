//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// neverDone never closes.
var neverDone = make(chan struct{})

// lying reports a deadline but its Done never closes and its Err stays nil:
// a ctx of a user's own making. The deadline it reports is the caller's
// word, and Deliver must keep it without the ctx's help.
type lying struct {
	context.Context
	at time.Time
}

func (l lying) Deadline() (time.Time, bool) { return l.at, true }
func (lying) Done() <-chan struct{}         { return neverDone }
func (lying) Err() error                    { return nil }

// A ctx whose deadline never fires its Done, to a destination whose owner
// is silent (its batcher hangs in the codec, so nothing there answers the
// delivery, not even at its deadline): Deliver returns ErrUnreachable with
// context.DeadlineExceeded soon after the deadline the ctx reports. Before,
// it waited on the ctx's Done alone, so it waited until the node left.
func TestADeadlineWhoseDoneNeverClosesIsKept(t *testing.T) {
	const silent = "to the silent owner"
	hang := make(chan struct{})
	dests := names(24) // the second member owns one (of 8, none in 1 run of 256)
	ms := startTestCluster(t, 2, dests, memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.SizeHook = func(m codec.Message) int {
			if string(m.Body) == silent {
				<-hang
			}
			return len(m.Body)
		}
		return c
	}})
	// Registered after the members' leave, so it runs before it.
	t.Cleanup(func() { close(hang) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A destination the second member owns, its grain's PID cached on the
	// first.
	var far string
	for _, d := range dests {
		_, err := ms[0].node.Deliver(ctx, d, codec.Message{Body: []byte("warm")})
		require.NoError(t, err)
		if far == "" && len(ms[1].fake(d).Sent()) > 0 {
			far = d
		}
	}
	require.NotEmpty(t, far, "the second member owns none of %d destinations", len(dests))

	const budget = 500 * time.Millisecond
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := ms[0].node.Deliver(lying{context.Background(), start.Add(budget)}, far, codec.Message{Body: []byte(silent)})
		done <- err
	}()
	select {
	case err := <-done:
		took := time.Since(start)
		assert.ErrorIs(t, err, clustered.ErrUnreachable)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.GreaterOrEqual(t, took, budget-50*time.Millisecond, "answered before the deadline")
		t.Logf("answered %v after the call, the deadline was %v", took, budget)
	case <-time.After(budget + 5*time.Second):
		t.Fatalf("Deliver still waits %v after a deadline of %v", budget+5*time.Second, budget)
	}
}

// Typed nil pointers of the wire's and the cluster's message types, sent to
// Node.PID in this process (only a local sender can make one: the wire
// never decodes one), are bad input: a sender waiting is answered at once
// with messages.ErrNotDeliver, and the member serves the next delivery.
// Before, each was dereferenced on the sender's goroutine.
func TestTypedNilMessagesToTheNodeAreHarmless(t *testing.T) {
	m := startTestCluster(t, 1, []string{"plain"}, memberOpts{})[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := m.node.Deliver(ctx, "plain", codec.Message{Body: []byte("first")})
	require.NoError(t, err)

	for _, msg := range []any{
		(*clusterpb.DeliverReplies)(nil),
		(*clusterpb.HandoffRequest)(nil),
		(*clusterpb.HandoffDone)(nil),
		(*messages.Delivered)(nil),
		(*cluster.ActivationResponse)(nil),
		(*actor.DeadLetterResponse)(nil),
	} {
		res, err := m.system.Root.RequestFuture(m.node.PID(), msg, 5*time.Second).Result()
		require.NoError(t, err, "%T: the sender is answered", msg)
		d, ok := res.(*messages.Delivered)
		require.True(t, ok, "%T: %T", msg, res)
		assert.ErrorIs(t, d.Err, messages.ErrNotDeliver, "%T", msg)
	}
	// A list of replies with a nil in it has no sender to answer.
	m.system.Root.Send(m.node.PID(), &clusterpb.DeliverReplies{Replies: []*clusterpb.DeliverReply{nil}})

	for i := range 3 {
		_, err = m.node.Deliver(ctx, "plain", codec.Message{Body: []byte(fmt.Sprint("after ", i))})
		require.NoError(t, err)
	}
	assert.Len(t, m.fake("plain").Sent(), 4)
}
