package clustered

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerHandsOffOnlyWhenDrained: a member answers a hand-off request
// only once its grain has stopped admitting and every delivery it admitted
// has been answered; and forgets the destination then.
func TestLedgerHandsOffOnlyWhenDrained(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	peer := actor.NewPID("b:1", "peer-grain")

	// No grain, nothing pending: done at once.
	h := l.request("idle", peer)
	assert.Nil(t, h.yield)
	assert.Equal(t, []*actor.PID{peer}, h.done)
	assert.Empty(t, l.dests)

	require.True(t, l.register("d", grain))
	l.admit("d")
	l.admit("d")
	h = l.request("d", peer)
	assert.Equal(t, grain, h.yield, "the admitting grain must be told to yield")
	assert.Empty(t, h.done)
	assert.Empty(t, l.unregister("d", actor.NewPID("a:1", "another")).done, "only the registered grain unregisters")
	assert.Empty(t, l.unregister("d", grain).done, "two deliveries are still pending")
	assert.Empty(t, l.answered("d").done)
	h = l.answered("d")
	assert.Equal(t, []*actor.PID{peer}, h.done)
	assert.Equal(t, "d", h.destination)
	assert.Empty(t, l.dests, "a handed-off destination is forgotten")
}

// TestLedgerLeave: Leave's channel closes once nothing is held, and no
// grain registers afterwards.
func TestLedgerLeave(t *testing.T) {
	l := newLedger()
	grain := actor.NewPID("a:1", "grain")
	require.True(t, l.register("d", grain))
	l.admit("d")
	grains, idle := l.leave()
	assert.Equal(t, []*actor.PID{grain}, grains)
	assert.False(t, l.register("e", actor.NewPID("a:1", "late")))
	l.unregister("d", grain)
	select {
	case <-idle:
		t.Fatal("idle with a delivery pending")
	default:
	}
	l.answered("d")
	<-idle

	// Leaving with nothing held is idle at once.
	_, idle = newLedger().leave()
	<-idle
}

// TestCallersClose: close refuses newcomers and waits for those inside.
func TestCallersClose(t *testing.T) {
	var c callers
	require.True(t, c.enter())
	done := c.close()
	assert.False(t, c.enter())
	select {
	case <-done:
		t.Fatal("closed with a caller inside")
	default:
	}
	c.exit()
	<-done
}
