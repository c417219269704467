package clustered

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The cancels keep a caller's cancel until its record settles it, or past
// the caller's deadline at the latest (a cancel that came after its
// delivery's answer left is never settled), and cost a delivery nothing
// while there are none.
func TestCancelsKeepACancelUntilSettledOrExpired(t *testing.T) {
	var cs cancels
	a, b, c := callKey{"m1:1", "e$1", 1}, callKey{"m1:1", "e$1", 2}, callKey{"m2:1", "e$1", 1}
	assert.False(t, cs.has(a))
	now := time.Unix(1000, 0)
	cs.add(a, now.Add(5*time.Second), now)
	cs.add(b, now.Add(time.Second), now)
	assert.True(t, cs.has(a))
	assert.True(t, cs.has(b))
	assert.False(t, cs.has(c), "another member's call of the same number")
	assert.False(t, cs.has(callKey{"m1:1", "e$2", 1}), "the same call of a process restarted at the same address")
	cs.done(a)
	assert.False(t, cs.has(a))
	assert.EqualValues(t, 1, cs.n.Load())

	// b is never settled: the next add, a second on, forgets it once its
	// time has passed.
	later := now.Add(2 * time.Second)
	cs.add(c, later.Add(time.Second), later)
	assert.False(t, cs.has(b), "an expired cancel is kept")
	assert.True(t, cs.has(c))
	cs.done(c)
	assert.Zero(t, cs.n.Load())
	assert.Empty(t, cs.m)
}
