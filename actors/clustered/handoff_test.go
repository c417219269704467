//go:build !race

package clustered_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJoinHandsOff: a member joins while two members deliver, concurrently
// for each ordering group, to destinations some of which move to it. No
// group ever has two requests in flight at the server, every caller's order
// holds, every delivery succeeds, and nothing acknowledged is missing.
func TestJoinHandsOff(t *testing.T) {
	pool := names(24)
	w := newWatched(t, 300*time.Millisecond, pool...)
	c := newManaged(t, 3)
	dests := c.pick(pool, 2, 3, 0, 1, 2)
	o := memberOpts{codec: w.codecFor(t, handoffTuning)}
	ms := []*member{c.start(t, 0, pool, o), c.start(t, 1, pool, o)}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)

	l := startLoad(ms, dests, 2, 4)
	l.waitSuccesses(t, 200)
	joined := time.Now()
	ms = append(ms, c.start(t, 2, pool, o))
	waitMembers(t, ms, 3)
	l.waitSuccesses(t, 400)
	l.finish()

	missing, violations := l.check(w)
	before, after := l.slowest(joined)
	t.Logf("join: %d delivered, %d requests, longest gap between successes %v, slowest delivery before the join %v, from it on %v",
		len(l.acked), w.requests.Load(), l.gap(), before, after)
	assert.Zero(t, w.overlaps.Load(), "requests of one group in flight at once")
	assert.Zero(t, violations, "order violations")
	assert.Zero(t, missing, "acknowledged but missing")
	assert.Empty(t, l.errs, "first of each: %v", l.first)
	// The joiner did batch the destinations it now owns.
	require.Eventually(t, func() bool { return ms[2].inst.Stats().Batchers > 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestLeaveHandsOff: a member leaves gracefully while the two others
// deliver, concurrently for each ordering group, to destinations some of
// which it owned. No group ever has two requests in flight, order holds,
// every delivery succeeds, nothing acknowledged is missing.
func TestLeaveHandsOff(t *testing.T) {
	w, dests, ms := threeMembers(t, 300*time.Millisecond)

	l := startLoad(ms[:2], dests, 2, 4)
	l.waitSuccesses(t, 200)
	require.Positive(t, ms[2].inst.Stats().Batchers, "the leaver owns none of the destinations")
	left := time.Now()
	ms[2].leave(t)
	leaveTook := time.Since(left)
	waitMembers(t, ms, 2)
	l.waitSuccesses(t, 400)
	l.finish()

	missing, violations := l.check(w)
	before, after := l.slowest(left)
	t.Logf("leave: %d delivered, %d requests, longest gap between successes %v, slowest delivery before the leave %v, from it on %v, Leave took %v",
		len(l.acked), w.requests.Load(), l.gap(), before, after, leaveTook)
	assert.Zero(t, w.overlaps.Load(), "requests of one group in flight at once")
	assert.Zero(t, violations, "order violations")
	assert.Zero(t, missing, "acknowledged but missing")
	assert.Empty(t, l.errs, "first of each: %v", l.first)
	t.Logf("the leaver was %s", ms[2].system.Address())
}

var _ = context.Background

// threeMembers starts three automanaged members on loopback, with a
// watched Pub/Sub fake whose requests take latency, and returns the fake,
// the destinations picked so that each member owns some, and the members,
// which leave when the test ends.
func threeMembers(t *testing.T, latency time.Duration) (*watched, []string, []*member) {
	t.Helper()
	pool := names(24)
	w := newWatched(t, latency, pool...)
	c := newManaged(t, 3)
	dests := c.pick(pool, 2, 3, 0, 1, 2)
	o := memberOpts{codec: w.codecFor(t, handoffTuning)}
	ms := []*member{c.start(t, 0, pool, o), c.start(t, 1, pool, o), c.start(t, 2, pool, o)}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 3)
	return w, dests, ms
}
