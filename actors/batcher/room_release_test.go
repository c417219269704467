package batcher

import (
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/mono"
	"github.com/ankusa/sinkbatch/messages"
)

// roomDeliver is call n's Deliver, naming a Room owned by a roomOwner, as
// the front door's call record does.
func roomDeliver(l *events, n uint32, group, key string) *messages.Deliver {
	room := &Room{}
	room.SetOwner(&roomOwner{l: l, n: n})
	d := &messages.Deliver{Message: codec.Message{Tenant: "t", Group: group, IdempotencyKey: key, Body: []byte("m")}}
	d.Ref = &Direct{Listener: l, Sender: &actor.PID{Id: "caller", RequestId: n}, Room: room}
	return d
}

// roomEntry is d's entry as the batcher admits it: in d's Room if it is
// the first admission, else in an entry of its own.
func roomEntry(d *messages.Deliver, deadline int64) *entry {
	e, left := entryFor(d)
	r := d.Ref.(*Direct)
	*e = entry{msg: &d.Message, to: caller{deliver: d, sender: r.Sender}, size: 1, deadline: deadline, left: left}
	return e
}

func roomBatcher(d *dispatch) *Batcher {
	return &Batcher{p: &Params{}, d: d, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// answerUnclaimed answers f's entries that nobody claimed yet, as a request
// goroutine whose finishWith won them does.
func answerUnclaimed(b *Batcher, f *inflight) {
	n := len(f.entries)
	won := make([]bool, n)
	for i := range won {
		won[i] = f.claims[i].CompareAndSwap(false, true)
	}
	answerWon(b, f, won)
}

func answerWon(b *Batcher, f *inflight, won []bool) {
	n := len(f.entries)
	b.answer(f, &buffers{msgs: make([]codec.Message, n), results: make([]codec.Result, n)}, won)
}

// A Deliver admitted twice (an actor's Deliver sent again, or a copy
// naming the same Direct) has one entry in its Room and one of its own:
// only the Room's entry lets go of the Room, once, after its answer; the
// other's answer must not let go of it again, which would reset the record
// while its caller still holds it. (That other answer still goes through
// the Deliver's Direct, which is why an owned Room's Deliver must be sent
// once, as the front door sends it: see Owner.)
func TestASecondAdmissionNeverReleasesTheRoom(t *testing.T) {
	s := testSettings()
	s.linger = 0
	d := handoffDispatch(s)
	b := roomBatcher(d)
	l := &events{}
	del := roomDeliver(l, 1, "", "")
	far := int64(math.MaxInt64)
	first, second := roomEntry(del, far), roomEntry(del, far)
	require.NotSame(t, first, second)
	require.True(t, d.admit(first, mono.Now(), false).ok)
	require.True(t, d.admit(second, mono.Now(), false).ok)
	f := take(d)
	require.NotNil(t, f)
	require.Len(t, f.entries, 2)
	r := d.finishWith(f, mono.Now(), outcome{})
	answerWon(b, f, r.won)
	assert.Equal(t, []string{"answer 1", "release 1", "answer 1"}, l.log)
}

// Only a request goroutine's answer from its request's result lets go of a
// Room. Entries answered otherwise, though a request goroutine answers
// some of them, are never let go of: the followers of a group that paused
// (settle), entries whose deadline passed in the queue (answerDropped),
// everything a restart abandons, queued, waiting or in flight, and an entry
// that waited for room, even once it is sent and answered.
func TestOnlyARequestsOwnResultsReleaseARoom(t *testing.T) {
	s := strictSettings() // 1 entry a batch, no linger
	s.block, s.queueMax = true, 3
	d := handoffDispatch(s)
	b := roomBatcher(d)
	l := &events{}
	now := mono.Now()
	far := int64(math.MaxInt64)
	soon := now + int64(time.Millisecond)
	admit := func(n uint32, group, key string, deadline int64) admission {
		t.Helper()
		a := d.admit(roomEntry(roomDeliver(l, n, group, key), deadline), now, false)
		require.False(t, a.down)
		return a
	}
	require.True(t, admit(1, "g", "k1", far).ok)
	require.True(t, admit(2, "g", "k2", far).ok)
	require.True(t, admit(3, "", "", soon).ok)
	f1 := take(d)
	require.NotNil(t, f1)
	require.Len(t, f1.entries, 1, "call 1; g is gated behind it")

	// Call 1 failed retryably: g pauses, call 2 is taken out and answered
	// by the request goroutine, which also answers call 1 from the result.
	r := d.finishWith(f1, now, failing(f1, "k1"))
	answerWon(b, f1, r.won)
	b.settle(r, now)
	require.Len(t, r.held, 1)
	f2 := r.next
	require.NotNil(t, f2, "call 3 is due")
	answerUnclaimed(b, f2)
	assert.Nil(t, finishNow(d, f2))
	assert.Equal(t, []string{"answer 1", "release 1", "answer 2", "answer 3", "release 3"}, l.log)

	// Call 4's deadline passes in the queue.
	l.log = nil
	require.True(t, admit(4, "", "", soon).ok)
	now = soon + 1
	b.answerDropped(d.sweep(now), now)
	assert.Equal(t, []string{"answer 4"}, l.log)

	// Calls 5..7 fill the queue and call 8 waits; call 5 is in flight
	// when a restart abandons everything. Its request goroutine then
	// finds every claim taken.
	l.log = nil
	for n := uint32(5); n <= 7; n++ {
		require.True(t, admit(n, "", "", far).ok)
	}
	require.True(t, admit(8, "", "", far).waiting)
	f3 := take(d)
	require.NotNil(t, f3)
	b.answerEach(d.abandon(0, false), messages.ErrBatcherDown)
	r = d.finishWith(f3, now, outcome{})
	answerWon(b, f3, r.won)
	assert.ElementsMatch(t, []string{"answer 5", "answer 6", "answer 7", "answer 8"}, l.log)

	// Calls 9..11 fill the queue and call 12 waits, then is promoted as
	// room frees, sent and answered from its request's result: having
	// waited, its Room is never let go of (the waiting list's slices may
	// still hold it).
	l.log = nil
	for n := uint32(9); n <= 11; n++ {
		require.True(t, admit(n, "", "", far).ok)
	}
	require.True(t, admit(12, "", "", far).waiting)
	for f := take(d); f != nil; {
		r := d.finishWith(f, now, outcome{})
		answerWon(b, f, r.won)
		f = r.next
	}
	assert.Equal(t, []string{"answer 9", "release 9", "answer 10", "release 10", "answer 11", "release 11", "answer 12"}, l.log)
}
