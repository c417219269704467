package batcher

import (
	"math"
	"time"
)

// The batcher's clock: nanoseconds on Go's monotonic clock since epoch, a
// private instant of this process (not Unix time). Every time the rules see
// (deadlines, linger, pause ends, ages) is on it.
// Deadlines, wake-ups and ages are durations apart, which a step of the
// wall clock (NTP, a resumed VM) must neither shorten nor stretch: on Unix
// time, a step back of an hour would leave a linger timer waiting an hour.
// epoch is an hour before the process started, so that no instant the
// batcher sees is 0, which its fields use for "none".
var epoch = time.Now().Add(-time.Hour)

// clock is now on the batcher's clock.
func clock() int64 { return int64(time.Since(epoch)) }

// instant is t on the batcher's clock, saturated to the int64 range (a
// deadline 292 years away is "never", not an overflow into the past):
// on the monotonic clock when t carries a reading (a deadline made from
// time.Now, as context.WithTimeout makes it), else on the wall clock.
func instant(t time.Time) int64 { return int64(t.Sub(epoch)) }

// timeAt is n on the batcher's clock as a time.Time, with a monotonic
// reading unless n is too far away to carry one.
func timeAt(n int64) time.Time { return epoch.Add(time.Duration(n)) }

// addSat is a+d for a time a and a duration d ≥ 0, saturated at
// math.MaxInt64 ("never"): a Tuning or DefaultTimeout of hundreds of years
// must not overflow into the past.
func addSat(a, d int64) int64 {
	if a > math.MaxInt64-d {
		return math.MaxInt64
	}
	return a + d
}
