//go:build !race

package clustered_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// The actor form takes a non-nil *clustered.Deliver. Anything else sent to
// Node.PID with a sender (a nil *Deliver, a Deliver by value, the
// instance's *messages.Deliver, a stray value) is bad input: its sender is
// answered at once with an error (errors.Is messages.ErrNotDeliver,
// permanent), a Deliver by value keeps its Ref, and the member lives on.
// Before, a nil *Deliver crashed the process (a nil dereference on a
// goroutine of the node) and the rest were dropped without an answer, so
// their senders waited for their own timeouts.
func TestActorFormAnswersWhatIsNotADeliverAtOnce(t *testing.T) {
	m := startTestCluster(t, 1, []string{"plain"}, memberOpts{})[0]
	for _, tc := range []struct {
		name string
		msg  any
		ref  any
	}{
		{"nil *Deliver", (*clustered.Deliver)(nil), nil},
		{"Deliver by value", clustered.Deliver{Destination: "plain", Message: codec.Message{Body: []byte("x")}, Ref: 7}, 7},
		{"*messages.Deliver", &messages.Deliver{Message: codec.Message{Body: []byte("x")}}, nil},
		{"a string", "plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A timeout well past "at once": it only catches a sender
			// left waiting.
			res, err := m.system.Root.RequestFuture(m.node.PID(), tc.msg, 5*time.Second).Result()
			require.NoError(t, err, "the sender is answered")
			d, ok := res.(*messages.Delivered)
			require.True(t, ok, "%T", res)
			assert.ErrorIs(t, d.Err, messages.ErrNotDeliver)
			assert.True(t, codec.IsPermanent(d.Err))
			assert.Equal(t, tc.ref, d.Ref)
		})
	}
	_, err := m.node.Deliver(context.Background(), "plain", codec.Message{Body: []byte("still served")})
	require.NoError(t, err)
}

// Destination names at the edges of [A-Za-z0-9._-]{1,200}, delivered from
// both members (one owns each, the other goes across the wire): each is
// its own destination and is sent; a name just outside is refused by New,
// and one not registered by Deliver, at once.
func TestDestinationNamesAtTheEdges(t *testing.T) {
	edge := []string{".", "..", "-", "_", strings.Repeat("a", 200), "A.b-C_9", "0"}
	ms := startTestCluster(t, 2, edge, memberOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range edge {
		for i, m := range ms {
			_, err := m.node.Deliver(ctx, name, codec.Message{Body: []byte(name)})
			require.NoError(t, err, "%q from member %d", name, i)
		}
	}
	for _, name := range edge {
		sent := 0
		for _, m := range ms {
			for _, s := range m.fake(name).Sent() {
				assert.Equal(t, name, string(s.Body), "a message to %q went to another destination", name)
				sent++
			}
		}
		assert.Equal(t, 2, sent, "%q", name)
	}

	for _, bad := range []string{"", strings.Repeat("a", 201), "a/b", "a b", "é", "a\n"} {
		_, err := clustered.New(ms[0].system, clustered.Config{Instance: ms[0].inst, Destinations: clustered.Destinations{bad: ms[0].codecs["."]}})
		assert.ErrorContains(t, err, "is not [A-Za-z0-9._-]{1,200}", "%q", bad)
		_, err = ms[0].node.Deliver(ctx, bad, codec.Message{Body: []byte("x")})
		assert.ErrorIs(t, err, clustered.ErrUnknownDestination, "%q", bad)
	}
}

// A deadline that has already passed, or a ctx already cancelled, is
// answered at once with the ctx's error, by Deliver and DeliverResult
// alike, and nothing is sent; the actor form's past Deadline likewise.
func TestPastDeadlineIsAnsweredAtOnceAndNotSent(t *testing.T) {
	m := startTestCluster(t, 1, []string{"plain"}, memberOpts{})[0]
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	_, err := m.node.Deliver(past, "plain", codec.Message{Body: []byte("late")})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = m.node.DeliverResult(past, "plain", codec.Message{Body: []byte("late")})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = m.node.DeliverResult(cancelled, "plain", codec.Message{Body: []byte("late")})
	assert.ErrorIs(t, err, context.Canceled)
	res, err := m.system.Root.RequestFuture(m.node.PID(), &clustered.Deliver{Destination: "plain", Message: codec.Message{Body: []byte("late")},
		Deadline: time.Now().Add(-time.Second), Ref: 1}, 5*time.Second).Result()
	require.NoError(t, err)
	assert.ErrorIs(t, res.(*messages.Delivered).Err, context.DeadlineExceeded)
	_, err = m.node.Deliver(context.Background(), "plain", codec.Message{Body: []byte("on time")})
	require.NoError(t, err)
	sent := m.fake("plain").Sent()
	require.Len(t, sent, 1)
	assert.Equal(t, "on time", string(sent[0].Body))
}
