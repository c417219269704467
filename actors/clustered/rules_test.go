//go:build !race

package clustered_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// ownerOf is the member that owns destination among ms, by the hash the
// cluster's identity lookup uses.
func ownerOf(t testing.TB, ms []*member, destination string) (owner, other *member) {
	t.Helper()
	var members cluster.Members
	for _, m := range ms {
		host, port, err := m.system.GetHostPort()
		require.NoError(t, err)
		members = append(members, &cluster.Member{Host: host, Port: int32(port), Kinds: []string{clustered.Kind}})
	}
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(members)
	addr := rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Identity: destination, Kind: clustered.Kind})
	for _, m := range ms {
		if m.system.Address() == addr {
			owner = m
		} else {
			other = m
		}
	}
	require.NotNil(t, owner)
	return owner, other
}

// TestRules runs the rules of one cluster of three members with the
// in-process provider.
func TestRules(t *testing.T) {
	// Every member's codec for "gated" waits for release on the message
	// "block", one request at a time.
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	var closeOnce sync.Once
	t.Cleanup(func() { closeOnce.Do(func() { close(release) }) })
	o := memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		switch name {
		case "gated":
			c.Tune.MaxInflight = 1
			c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
				if string(batch[0].Body) == "block" {
					entered <- struct{}{}
					<-release
				}
				return ok(batch), nil
			}
		case "failing":
			c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
				if string(batch[0].Body) == "throttle" {
					return nil, &codec.EntryError{Code: "ResourceExhausted", Message: "slow down", Throttled: true}
				}
				rs := ok(batch)
				for i, m := range batch {
					if string(m.Body) == "bad" {
						rs[i] = codec.Result{Err: &codec.EntryError{Code: "InvalidArgument", Message: "bad body", Permanent: true}}
					}
				}
				return rs, nil
			}
		}
		return c
	}}
	ms := startTestCluster(t, 3, []string{"plain", "gated", "failing"}, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("the deadline travels as a budget", func(t *testing.T) {
		owner, other := ownerOf(t, ms, "gated")
		blocked := make(chan error, 1)
		go func() {
			_, err := other.node.Deliver(ctx, "gated", codec.Message{Body: []byte("block")})
			blocked <- err
		}()
		<-entered
		// Queued behind the blocked request, past its deadline when the
		// request returns: the owner must drop it, not send it.
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := other.node.Deliver(short, "gated", codec.Message{Body: []byte("late")})
		cancelShort()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// The owner's deadline is the caller's plus the request's transit:
		// wait until the owner's batcher has dropped the entry.
		require.Eventually(t, func() bool { return owner.inst.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		closeOnce.Do(func() { close(release) })
		require.NoError(t, <-blocked)
		// Ask again to be sure "late" had every chance to be sent.
		_, err = other.node.Deliver(ctx, "gated", codec.Message{Body: []byte("after")})
		require.NoError(t, err)
		var bodies []string
		for _, m := range owner.fake("gated").Sent() {
			bodies = append(bodies, string(m.Body))
		}
		assert.Equal(t, []string{"block", "after"}, bodies)
	})

	t.Run("errors keep their meaning", func(t *testing.T) {
		_, other := ownerOf(t, ms, "failing")
		_, err := other.node.Deliver(ctx, "failing", codec.Message{Body: []byte("bad")})
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, codec.EntryError{Code: "InvalidArgument", Message: "bad body", Permanent: true}, *ee)
		assert.True(t, codec.IsPermanent(err))

		_, err = other.node.Deliver(ctx, "failing", codec.Message{Body: []byte("throttle")})
		assert.True(t, codec.IsThrottled(err), "%v", err)
		assert.False(t, codec.IsPermanent(err))

		_, err = other.node.Deliver(ctx, "nowhere", codec.Message{Body: []byte("x")})
		assert.ErrorIs(t, err, clustered.ErrUnknownDestination)
		assert.True(t, codec.IsPermanent(err))

		done, cancelDone := context.WithCancel(ctx)
		cancelDone()
		_, err = other.node.Deliver(done, "plain", codec.Message{Body: []byte("x")})
		assert.ErrorIs(t, err, context.Canceled)
	})

	t.Run("a grain on a member that does not own its destination refuses and stops", func(t *testing.T) {
		_, other := ownerOf(t, ms, "plain")
		// protoactor activates a grain on whichever member is asked.
		f := other.system.Root.RequestFuture(actor.NewPID(other.system.Address(), disthash.PartitionActivatorActorName),
			&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: "plain", Kind: clustered.Kind}}, 5*time.Second)
		res, err := f.Result()
		require.NoError(t, err)
		grain := res.(*cluster.ActivationResponse).Pid
		require.NotNil(t, grain)
		f = other.system.Root.RequestFuture(grain, &clusterpb.DeliverBatch{Destination: "plain", Requests: []*clusterpb.DeliverRequest{
			{Body: []byte("stray"), BudgetNanos: int64(5 * time.Second), Call: 7},
		}}, 5*time.Second)
		res, err = f.Result()
		require.NoError(t, err)
		replies := res.(*clusterpb.DeliverReplies).Replies
		require.Len(t, replies, 1)
		assert.True(t, replies[0].NotOwner)
		assert.Equal(t, uint32(7), replies[0].Call)
		require.Eventually(t, func() bool {
			_, alive := other.system.ProcessRegistry.GetLocal(grain.Id)
			return !alive
		}, 5*time.Second, 10*time.Millisecond, "the refusing grain did not stop")
		for _, m := range ms {
			for _, sent := range m.fake("plain").Sent() {
				assert.NotEqual(t, "stray", string(sent.Body))
			}
		}
	})

	t.Run("actor form", func(t *testing.T) {
		m := ms[0]
		f := m.system.Root.RequestFuture(m.node.PID(), &clustered.Deliver{Destination: "plain", Message: codec.Message{Body: []byte("from an actor")}, Ref: 42}, 10*time.Second)
		res, err := f.Result()
		require.NoError(t, err)
		d := res.(*messages.Delivered)
		assert.NoError(t, d.Err)
		assert.NotEmpty(t, d.ID)
		assert.Equal(t, 42, d.Ref)
		f = m.system.Root.RequestFuture(m.node.PID(), &clustered.Deliver{Destination: "nowhere", Ref: 43}, 10*time.Second)
		res, err = f.Result()
		require.NoError(t, err)
		assert.ErrorIs(t, res.(*messages.Delivered).Err, clustered.ErrUnknownDestination)
	})

	t.Run("after Leave", func(t *testing.T) {
		m := ms[2]
		m.leave(t)
		_, err := m.node.Deliver(ctx, "plain", codec.Message{Body: []byte("x")})
		assert.ErrorIs(t, err, messages.ErrStopped)
		waitMembers(t, ms, 2)
		for _, d := range []string{"plain", "gated", "failing"} {
			_, err := ms[0].node.Deliver(ctx, d, codec.Message{Body: []byte("still served")})
			assert.NoError(t, err, d)
		}
	})
}

// ok is a success for every message of batch.
func ok(batch []codec.Message) []codec.Result {
	rs := make([]codec.Result, len(batch))
	for i := range rs {
		rs[i] = codec.Result{ID: "id-" + string(batch[i].Body)}
	}
	return rs
}

var _ = errors.Is
