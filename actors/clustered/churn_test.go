//go:build !race

package clustered_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Membership changes that overlap: a member joins while another leaves,
// and a member that just joined leaves before the hand-offs its join
// started have settled, and then joins again on the same address. The
// hand-off tests make one change at a time; here each change starts while
// the last is still moving destinations. Callers on every member send
// each group's messages in order, through all of it. At the server: no
// group ever has two requests in flight, every stored message is in its
// caller's order and stored once, every acknowledged message is stored
// under its id, and the only error a caller sees is ErrStopped, from its
// own member leaving.
func TestOverlappingJoinsAndLeaves(t *testing.T) {
	pool := names(24)
	w := newWatched(t, 300*time.Millisecond, pool...)
	c := newManaged(t, 4)
	o := memberOpts{codec: w.codecFor(t, handoffTuning)}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)

	var mu sync.Mutex
	var all []*member // every member started, for the cleanup
	startSlot := func(i int) *member {
		m := c.start(t, i, pool, o)
		mu.Lock()
		all = append(all, m)
		mu.Unlock()
		return m
	}
	t.Cleanup(func() { leaveAll(t, all) })
	m0, m1 := startSlot(0), startSlot(1)
	waitMembers(t, []*member{m0, m1}, 2)

	dests := pool[:12]
	l := startLoad([]*member{m0, m1}, dests, 2, 4)
	l.waitSuccesses(t, 300)

	// joinWhileLeaving starts slot's member while leaver leaves, a random
	// moment (under 400 ms) after the start began, and returns the member.
	joinWhileLeaving := func(slot int, leaver *member) *member {
		var joined *member
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); joined = startSlot(slot) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
			leaver.leave(t)
		}()
		wg.Wait()
		waitMembers(t, []*member{m0, joined}, 2)
		return joined
	}

	// 1. Slot 2 joins while slot 1 leaves.
	m2 := joinWhileLeaving(2, m1)
	l2 := startLoadAs("second", []*member{m2}, dests, 2, 4)
	l.waitSuccesses(t, 300)

	// 2. Slot 3 joins, and slot 2 leaves as soon as slot 3 is up: the
	// destinations slot 3 took from slot 2 may still be handing off.
	m3 := startSlot(3)
	m2.leave(t)
	waitMembers(t, []*member{m0, m3}, 2)
	l.waitSuccesses(t, 300)

	// 3. Slot 2 comes back on its old address while slot 3 leaves.
	m2b := joinWhileLeaving(2, m3)
	l3 := startLoadAs("third", []*member{m2b}, dests, 2, 4)
	l.waitSuccesses(t, 300)
	l.finish()
	l2.finish()
	l3.finish()

	for i, ld := range []*load{l, l2, l3} {
		missing, violations, unordered := ld.checkAcknowledged(w)
		assert.Zero(t, missing, "load %d: acknowledged but missing", i)
		assert.Zero(t, violations, "load %d: acknowledged out of order", i)
		assert.Zero(t, unordered, "load %d: stored out of order or twice", i)
		for class, n := range ld.errs {
			assert.Equal(t, "stopped", class, "load %d: %d errors, first: %s", i, n, ld.first[class])
		}
		t.Logf("load %d: %d acknowledged, errors %v, slowest %v", i, len(ld.acked), ld.errs, ld.maxLat)
	}
	assert.Zero(t, w.overlaps.Load(), "requests of one group in flight at once")
	t.Logf("%d requests", w.requests.Load())
}
