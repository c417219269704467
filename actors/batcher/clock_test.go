package batcher

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The batcher's clock saturates far instants instead of overflowing, never
// reads 0 (its fields' "none"), and a deadline made from time.Now comes
// back as the same instant on its monotonic reading.
func TestClockSaturatesAndRoundTrips(t *testing.T) {
	assert.Equal(t, int64(math.MaxInt64), instant(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)), "the year 3000 is never")
	assert.Greater(t, instant(time.Unix(0, math.MaxInt64).Add(time.Hour)), int64(200*365*24*time.Hour), "past the year 2262 is far away")
	assert.Equal(t, int64(math.MinInt64), instant(time.Time{}), "the zero time is long past")
	assert.Greater(t, clock(), int64(time.Hour)-1, "no instant is 0")

	now := time.Now()
	d := now.Add(1500 * time.Millisecond)
	got := timeAt(instant(d))
	assert.Equal(t, d.Sub(now), got.Sub(now), "an instant comes back as itself on the monotonic clock")
	_, hasMono := parseMono(got)
	assert.True(t, hasMono, "a near instant keeps a monotonic reading")
	assert.True(t, timeAt(math.MaxInt64).After(d), "never is after any deadline")
}

// parseMono reports whether t carries a monotonic reading: its String
// shows one as "m=".
func parseMono(t time.Time) (string, bool) {
	s := t.String()
	for i := 0; i+2 < len(s); i++ {
		if s[i:i+3] == "m=+" || s[i:i+3] == "m=-" {
			return s[i:], true
		}
	}
	return "", false
}
