//go:build !race

package clustered_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member crashes while a join moves its destinations to the joiner: the
// joiner asks it to hand off, and it never answers. The joiner must not
// wait for it past the provider dropping it, callers must be answered
// within their deadlines (ErrUnreachable for what the crashed member
// held, nothing else), nothing acknowledged may be missing or out of its
// caller's order, and deliveries must succeed again. With requests of a
// second in flight and the crash 0.2-0.7 s into the join, the crashed
// member held 24 deliveries (answered ErrUnreachable) and the slowest
// delivery took 1.6-2.6 s; a crash 1.2 s in came after the hand-off. Three
// things end the joiner's wait, each enough alone: the member leaving the
// topology, its connection being cut, and the grain's restart on the new
// topology (which no longer lists it).
func TestCrashDuringAJoin(t *testing.T) {
	pool := names(96)
	// A second per Publish: the victim is still draining when it crashes.
	w := newWatched(t, time.Second, pool...)
	c := newManaged(t, 3)
	// Destinations the victim (slot 1) owns before the join and the joiner
	// (slot 2) owns after it, and some that stay with slot 0.
	moving := c.moves(pool, 4, 1, []int{0, 1}, 2, []int{0, 1, 2})
	staying := c.moves(pool, 2, 0, []int{0, 1}, 0, []int{0, 1, 2})
	require.GreaterOrEqual(t, len(moving), 2, "too few destinations move from slot 1 to slot 2")
	o := memberOpts{codec: w.codecFor(t, handoffTuning)}
	ms := []*member{c.start(t, 0, pool, o), c.start(t, 1, pool, o)}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)

	l := startLoad(ms[:1], append(moving, staying...), 2, 3)
	l.waitSuccesses(t, 100)
	// The joiner starts; the victim crashes while the members take in the
	// new topology, with requests of a second still in flight.
	joined := make(chan *member, 1)
	go func() { joined <- c.start(t, 2, pool, o) }()
	time.Sleep(400 * time.Millisecond)
	crashed := time.Now()
	ms[1].crash(t)
	joiner := <-joined
	ms = append(ms, joiner)
	waitMembers(t, []*member{ms[0], joiner}, 2)
	dropped := time.Since(crashed)
	l.waitSuccesses(t, 100)
	l.finish()

	unordered := l.checkCrashed(t, w)
	t.Logf("crash during a join: %d delivered, errors %v, dropped after %v, longest gap %v, slowest delivery %v, unordered (unacknowledged included) %d",
		len(l.acked), l.errs, dropped, l.gap(), l.maxLat, unordered)
	assert.Positive(t, joiner.inst.Stats().Batchers, "the joiner batches nothing")
}
