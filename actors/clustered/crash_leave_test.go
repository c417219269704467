//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member leaves gracefully and, while it drains, the member its
// destinations are moving to crashes. The leaver's Leave must still end
// within its ctx (it used to take 10.5 s on a 3 s ctx, and return nil:
// protoactor's shutdown waits for its dial to the dead member to give
// up), callers (on the member that stays) must be answered within their
// deadlines with nothing but ErrUnreachable as an error, nothing
// acknowledged may be missing or out of its caller's order, and the
// member that stays must take the destinations over.
func TestCrashOfTheHeirDuringALeave(t *testing.T) {
	pool := names(96)
	// A second per Publish: the leaver is still draining when the heir
	// crashes.
	w := newWatched(t, time.Second, pool...)
	c := newManaged(t, 3)
	// Destinations the leaver (slot 1) owns and the heir (slot 2) takes
	// when it leaves, and some that stay with slot 0.
	moving := c.moves(pool, 4, 1, []int{0, 1, 2}, 2, []int{0, 2})
	staying := c.moves(pool, 2, 0, []int{0, 1, 2}, 0, []int{0, 2})
	require.GreaterOrEqual(t, len(moving), 2, "too few destinations move from slot 1 to slot 2")
	o := memberOpts{codec: w.codecFor(t, handoffTuning)}
	ms := []*member{c.start(t, 0, pool, o), c.start(t, 1, pool, o), c.start(t, 2, pool, o)}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 3)

	l := startLoad(ms[:1], append(moving, staying...), 2, 3)
	l.waitSuccesses(t, 100)
	leaver, heir := ms[1], ms[2]
	const leaveWithin = 4 * time.Second
	left := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), leaveWithin)
		defer cancel()
		left <- leaver.node.Leave(ctx)
	}()
	time.Sleep(300 * time.Millisecond)
	heir.crash(t)
	leaveErr := <-left
	leaveTook := time.Since(start)
	// The leaver had drained well within its ctx; protoactor's shutdown
	// then waits for its dial to the dead heir to give up (about 10 s),
	// and Leave returns at its ctx's end instead.
	if leaveErr != nil {
		assert.ErrorIs(t, leaveErr, context.DeadlineExceeded)
	}
	assert.Less(t, leaveTook, leaveWithin+time.Second, "Leave outlived its ctx")
	leaver.gone = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assert.NoError(t, leaver.inst.Stop(ctx))
	waitMembers(t, ms[:1], 1)
	l.waitSuccesses(t, 100)
	l.finish()

	unordered := l.checkCrashed(t, w)
	t.Logf("heir crashed during a leave: %d delivered, errors %v, Leave took %v, longest gap %v, slowest delivery %v, unordered (unacknowledged included) %d",
		len(l.acked), l.errs, leaveTook, l.gap(), l.maxLat, unordered)
	assert.GreaterOrEqual(t, ms[0].inst.Stats().Batchers, len(moving)+len(staying), "the member that stays does not batch every destination")
}
