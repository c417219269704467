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
