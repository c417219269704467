package clustered

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// While pauses handed over are being adopted, the destination's grain is
// told to wait (and told once they are in), and a hand-off request is
// answered only after: the pauses go with the destination, never left
// behind in an instance that no longer owns it.
func TestLedgerWaitsForPausesBeingAdopted(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	peer := actor.NewPID("b:1", "peer-grain")

	assert.False(t, l.adopting("d", grain), "nothing in flight")
	first, second := l.adoptBegin("d"), l.adoptBegin("d")
	require.Same(t, first, second)
	require.Same(t, first, l.register("d", grain), "the grain counts in the entry its adoptions are in")
	assert.True(t, l.adopting("d", grain))
	assert.True(t, l.adopting("d", grain), "still in flight")

	h := l.adoptEnd(first)
	assert.Empty(t, h.adopted, "one adoption is still in flight")
	assert.Empty(t, h.done)
	h = l.unregister("d", grain)
	assert.Empty(t, h.done, "the grain is gone, but an adoption is in flight")
	h = l.request("d", peer)
	assert.Empty(t, h.done, "handed off before the pauses are in")

	h = l.adoptEnd(second)
	assert.Empty(t, h.adopted, "the grain that unregistered is not told")
	assert.Equal(t, []*actor.PID{peer}, h.done, "handed off once the pauses are in")
	assert.Empty(t, l.dests)

	// A waiting grain is told once the last adoption is over, and once
	// however often it asked.
	d := l.adoptBegin("e")
	require.Same(t, d, l.register("e", grain))
	assert.True(t, l.adopting("e", grain))
	assert.True(t, l.adopting("e", grain))
	h = l.adoptEnd(d)
	assert.Equal(t, []*actor.PID{grain}, h.adopted, "asked twice, told once")
	assert.False(t, l.adopting("e", grain))
}
