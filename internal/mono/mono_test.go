package mono

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestNowIsNeverZeroAndNeverGoesBack(t *testing.T) {
	a := Now()
	b := Now()
	assert.Positive(t, a, "0 means none to callers")
	assert.GreaterOrEqual(t, b, a)
}

func TestAddSatSaturatesAtNever(t *testing.T) {
	now := Now()
	assert.Equal(t, now+int64(time.Second), AddSat(now, int64(time.Second)))
	assert.Equal(t, int64(math.MaxInt64), AddSat(now, math.MaxInt64), "centuries do not overflow into the past")
	assert.Equal(t, int64(math.MaxInt64), AddSat(math.MaxInt64, 1))
}

func TestInstantAndTimeRoundTrip(t *testing.T) {
	now := time.Now()
	assert.WithinDuration(t, now, Time(Instant(now)), time.Microsecond)
	assert.Equal(t, int64(math.MaxInt64), Instant(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), "a far deadline is never")
	wall := now.Round(0) // no monotonic reading: read on the wall clock
	assert.InDelta(t, float64(Instant(now)), float64(Instant(wall)), float64(time.Second))
}

// The clock saturates far instants instead of overflowing, never
// reads 0 (its fields' "none"), and a deadline made from time.Now comes
// back as the same instant on its monotonic reading.
func TestClockSaturatesAndRoundTrips(t *testing.T) {
	assert.Equal(t, int64(math.MaxInt64), Instant(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)), "the year 3000 is never")
	assert.Greater(t, Instant(time.Unix(0, math.MaxInt64).Add(time.Hour)), int64(200*365*24*time.Hour), "past the year 2262 is far away")
	assert.Equal(t, int64(math.MinInt64), Instant(time.Time{}), "the zero time is long past")
	assert.Greater(t, Now(), int64(time.Hour)-1, "no instant is 0")

	now := time.Now()
	d := now.Add(1500 * time.Millisecond)
	got := Time(Instant(d))
	assert.Equal(t, d.Sub(now), got.Sub(now), "an instant comes back as itself on the monotonic clock")
	_, hasMono := parseMono(got)
	assert.True(t, hasMono, "a near instant keeps a monotonic reading")
	assert.True(t, Time(math.MaxInt64).After(d), "never is after any deadline")
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
