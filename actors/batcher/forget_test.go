package batcher

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// forgetter is a Listener and Forgetter whose calls in gone stopped
// listening; it logs what it is told.
type forgetter struct {
	events
	gone map[uint32]bool
}

func (f *forgetter) Listening(pid *actor.PID) bool { return !f.gone[pid.RequestId] }
func (f *forgetter) Forgotten(pid *actor.PID) {
	f.log = append(f.log, fmt.Sprintf("forgotten %d", pid.RequestId))
}

// A Forgetter is told of every entry of its calls that the batcher drops
// unanswered because the call stopped listening: on arrival, and in the
// queue's sweeps. An entry whose deadline passed is answered instead, and
// a plain Listener is told nothing.
func TestAForgetterIsToldOfWhatIsDroppedUnanswered(t *testing.T) {
	f := &forgetter{gone: map[uint32]bool{2: true, 3: true, 5: true}}
	b := &Batcher{p: &Params{}}
	entryOf := func(l Listener, n uint32, deadline int64) *entry {
		sender := &actor.PID{Id: "caller", RequestId: n}
		d := &messages.Deliver{Message: codec.Message{Body: []byte("m")}, Ref: &Direct{Listener: l, Sender: sender}}
		return &entry{msg: &d.Message, to: caller{deliver: d, sender: sender}, deadline: deadline}
	}
	now := int64(1000)
	b.answerDropped([]*entry{entryOf(f, 1, now), entryOf(f, 2, math.MaxInt64), entryOf(f, 3, now)}, now)
	assert.Equal(t, []string{"answer 1", "forgotten 2", "answer 3"}, f.log)

	f.log = nil
	b.deliver(entryOf(f, 5, math.MaxInt64).to) // b has no queue: this stops at the check
	assert.Equal(t, []string{"forgotten 5"}, f.log)

	plain := &events{}
	b.answerDropped([]*entry{entryOf(plain, 4, math.MaxInt64)}, now)
	assert.Empty(t, plain.log)
}
