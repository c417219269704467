package batcher

import (
	"fmt"
	"github.com/ankusa/sinkbatch/internal/mono"
	"math"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// A Room holds the entry of the first admission of its Deliver only: a
// Deliver sent again (or a copy of it) gets an entry of its own, or two
// queue positions would share one entry.
func TestRoomServesOneDelivery(t *testing.T) {
	room := &Room{}
	d := &messages.Deliver{Ref: &Direct{Room: room}}
	first, left := entryFor(d)
	assert.Same(t, &room.e, first)
	assert.Same(t, &room.left, left, "the Room's entry hears its Leave")
	again, left := entryFor(d)
	assert.NotSame(t, first, again)
	assert.Nil(t, left)
	copied := *d
	copiedEntry, _ := entryFor(&copied)
	assert.NotSame(t, first, copiedEntry)

	noRoom, _ := entryFor(&messages.Deliver{Ref: &Direct{}})
	assert.NotNil(t, noRoom, "no Room: a new entry")
	noDirect, _ := entryFor(&messages.Deliver{})
	assert.NotNil(t, noDirect, "no Direct: a new entry")
}

// events logs, in order, what a Listener and the Owners of Rooms are told.
type events struct{ log []string }

func (l *events) Listening(*actor.PID) bool { return true }
func (l *events) Answer(pid *actor.PID, r codec.Result) {
	l.log = append(l.log, fmt.Sprintf("answer %d", pid.RequestId))
}

// roomOwner is the Owner of call n's Room.
type roomOwner struct {
	l *events
	n uint32
}

func (o *roomOwner) Release() { o.l.log = append(o.l.log, fmt.Sprintf("release %d", o.n)) }

// inRoom is call n's entry, in a Room owned by a roomOwner, as the front
// door's call record holds it.
func inRoom(l *events, n uint32, deadline int64) *entry {
	room := &Room{}
	room.SetOwner(&roomOwner{l: l, n: n})
	d := &messages.Deliver{Message: codec.Message{Tenant: "t", Body: []byte("m")}}
	sender := &actor.PID{Id: "caller", RequestId: n}
	d.Ref = &Direct{Listener: l, Sender: sender, Room: room}
	e, left := entryFor(d)
	*e = entry{msg: &d.Message, to: caller{deliver: d, sender: sender}, size: 1, deadline: deadline, left: left}
	return e
}

// A batcher lets go of a Room (Owner.Release) only for an entry its request
// goroutine answered from the request's result, and only after answering
// it: the front door hands the Room's record to another call then. An entry
// whose deadline passed in flight is answered by the actor, which the
// request goroutine cannot wait for; an entry that waited for room may
// still be in the waiting list's slices; an entry answered by a restart may
// still be in its request: none of them is released.
func TestARoomIsReleasedOnlyAfterItsRequestAnswersIt(t *testing.T) {
	s := testSettings() // 4 entries a batch, 2 in flight
	s.linger, s.queueMax, s.block = 0, 2, true
	d := handoffDispatch(s)
	l := &events{}
	b := &Batcher{p: &Params{}, d: d}
	now := mono.Now()
	// Far enough that no take at the clock's time finds it passed.
	soon := now + int64(time.Hour)
	far := int64(math.MaxInt64)
	admit := func(e *entry) admission {
		t.Helper()
		a := d.admit(e, now, false)
		require.False(t, a.down)
		return a
	}
	require.True(t, admit(inRoom(l, 1, far)).ok)
	require.True(t, admit(inRoom(l, 2, soon)).ok)
	require.True(t, admit(inRoom(l, 3, far)).waiting, "the queue holds 2: call 3 waits for room")
	answer := answerUnclaimed

	f1 := take(d)
	require.NotNil(t, f1)
	require.Len(t, f1.entries, 2, "calls 1 and 2; call 3 is promoted into the queue")
	// Call 2's deadline passes while f1 is in flight: the actor claims and
	// answers it.
	late, _ := d.expire(soon)
	b.answerEach(late, errExpiredInFlight)
	r := d.finishWith(f1, soon, outcome{})
	answerWon(b, f1, r.won)
	f2 := r.next
	require.NotNil(t, f2, "call 3 is due at once (no linger)")
	answer(b, f2)
	assert.Nil(t, finishNow(d, f2))

	// A restart (abandon) claims call 4's entry in flight and answers it.
	require.True(t, admit(inRoom(l, 4, far)).ok)
	f3 := take(d)
	require.NotNil(t, f3)
	b.answerEach(d.abandon(0, false), messages.ErrBatcherDown)
	r = d.finishWith(f3, mono.Now(), outcome{})
	answerWon(b, f3, r.won)

	assert.Equal(t, []string{"answer 2", "answer 1", "release 1", "answer 3", "answer 4"}, l.log)
}
