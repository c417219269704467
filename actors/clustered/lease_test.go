package clustered

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// validating is a codec with a Validator, to see fence keep it.
type validating struct{ *fakecodec.Codec }

func (validating) Validate(codec.Message) error { return nil }

// TestTheLeaseHoldsWhilePeersConfirm: with no peer taking part the lease
// holds; a peer that answered but never confirmed holds it back; its
// confirmation lets it hold for leaseTTL from when its probe was sent; a
// peer's word that the cluster dropped this member ends it for good.
func TestTheLeaseHoldsWhilePeersConfirm(t *testing.T) {
	l := newLease()
	l.topology(map[string]string{"peer": "127.0.0.1:2"})
	assert.True(t, l.holds(), "no peer has answered: none is waited for")
	sent := l.now()
	l.answer("127.0.0.1:2", "me", &clusterpb.LeaseAnswer{MemberId: "me", SentNanos: sent})
	assert.False(t, l.holds(), "a peer that answered without confirming")
	assert.True(t, l.speaks("127.0.0.1:2"))
	l.answer("127.0.0.1:2", "me", &clusterpb.LeaseAnswer{MemberId: "me", SentNanos: sent, Includes: true})
	assert.True(t, l.holds())
	assert.Equal(t, sent+int64(leaseTTL), l.until.Load(), "the confirmation counts from when its probe was sent")
	l.answer("127.0.0.1:9", "me", &clusterpb.LeaseAnswer{MemberId: "me", Excluded: true})
	assert.True(t, l.holds(), "a word from a member outside the list is not taken")
	assert.True(t, l.answer("127.0.0.1:2", "me", &clusterpb.LeaseAnswer{MemberId: "me", Excluded: true}))
	assert.False(t, l.holds(), "excluded")
	l.topology(map[string]string{})
	assert.False(t, l.holds(), "excluded for good")
}

// TestALeaseDoesNotWaitForAMemberThatLeftGracefully: a member that said it
// left gracefully (its HandoffDone naming no destination) and then gives
// no confirmation, as it does once its actor system stops, does not make
// the lease lapse while the member lists still hold it; it is probed no
// more, and its answers are not taken.
func TestALeaseDoesNotWaitForAMemberThatLeftGracefully(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	n := &Node{system: system, lease: newLease(), leftOK: map[string]bool{}}
	l := n.lease
	l.topology(map[string]string{"stays": "127.0.0.1:2", "leaves": "127.0.0.1:3"})
	confirm := func(address string, sent int64) {
		l.answer(address, "me", &clusterpb.LeaseAnswer{MemberId: "me", SentNanos: sent, Includes: true})
	}
	confirm("127.0.0.1:2", l.now())
	// The leaver's last confirmation is older than leaseTTL.
	confirm("127.0.0.1:3", l.now()-int64(leaseTTL)-1)
	require.False(t, l.holds(), "a confirmation older than leaseTTL")
	n.onLeft("127.0.0.1:3")
	assert.True(t, l.holds(), "the lease waits for a member that left gracefully")
	assert.Equal(t, map[string]string{"stays": "127.0.0.1:2"}, l.targets())
	l.answer("127.0.0.1:3", "me", &clusterpb.LeaseAnswer{MemberId: "me", SentNanos: l.now()})
	assert.True(t, l.holds(), "the leaver's answer was taken")
}

// TestAFencedCodecMakesNoRequestWithoutTheLease: the codec the instance is
// given sends while the lease holds, makes no request once it ran out, and
// keeps the codec's optional interfaces; it is a pointer.
func TestAFencedCodecMakesNoRequestWithoutTheLease(t *testing.T) {
	fake := fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	l := newLease()
	c := fence(validating{fake}, l)
	assert.Equal(t, reflect.Pointer, reflect.TypeOf(c).Kind(), "the instance caches a codec's route by pointer only")
	_, isValidator := c.(codec.Validator)
	assert.True(t, isValidator)
	_, isDescriber := c.(codec.Describer)
	assert.False(t, isDescriber)
	_, err := c.SendBatch(context.Background(), []codec.Message{{Body: []byte("a")}})
	require.NoError(t, err)
	l.until.Store(l.now() - 1)
	_, err = c.SendBatch(context.Background(), []codec.Message{{Body: []byte("b")}})
	require.ErrorIs(t, err, ErrUnreachable)
	assert.Len(t, fake.Sent(), 1, "a request was made without the lease")
}

// TestABatchTheFenceRefusedIsAnsweredNotSent: a delivery whose batch the
// fenced codec refused as its request was about to begin (the lease had
// run out: nothing was sent) is answered "not the owner", and its caller
// tries again, as for a delivery dropped for want of the lease; not
// ErrUnreachable, which would tell it the message may have been sent.
func TestABatchTheFenceRefusedIsAnsweredNotSent(t *testing.T) {
	discard := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return discard }))
	inst, err := actors.Start(system, actors.Config{Logger: discard})
	require.NoError(t, err)
	defer func() { assert.NoError(t, inst.Stop(context.Background())) }()
	n, err := New(system, Config{Instance: inst, Destinations: Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}, Logger: discard})
	require.NoError(t, err)
	got := make(chan *clusterpb.DeliverReply, 1)
	caller := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if r, ok := c.Message().(*clusterpb.DeliverReplies); ok {
			got <- r.Replies[0]
		}
	}))
	defer system.Root.Stop(caller)
	h := &held{destination: "d"}
	h.pending.Store(1)
	h.open.Store(1)
	a := newAdmitted()
	a.n, a.held, a.replyTo, a.call = n, h, caller, 7
	a.Answer(nil, codec.Result{Err: errLeaseLapsed})
	select {
	case r := <-got:
		assert.Equal(t, uint32(7), r.Call)
		assert.True(t, r.NotOwner, "answered %v", r.Error)
		assert.Nil(t, r.Error)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	assert.Zero(t, h.pending.Load(), "not counted answered in the ledger")
}
