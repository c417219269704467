// Package mono is sinkbatch's one clock: nanoseconds on Go's monotonic clock
// since a process-wide epoch, as an int64 that the batching rules and the
// front door's waiters compare and store in atomics.
//
// Deadlines, wake-ups and ages are durations apart, which a step of the wall
// clock (NTP, a resumed VM) must neither shorten nor stretch: on Unix time, a
// step back of an hour would leave a linger timer waiting an hour. The epoch
// is an hour before the process started, so that no instant is 0, which
// callers use for "none", and math.MaxInt64 means "never".
package mono

import (
	"math"
	"time"
)

// epoch is an hour before the process started.
var epoch = time.Now().Add(-time.Hour)

// Now is the current instant: always above 0.
func Now() int64 { return int64(time.Since(epoch)) }

// Instant is t on this clock, saturated to the int64 range (a deadline 292
// years away is "never", not an overflow into the past): on the monotonic
// clock when t carries a reading (a deadline made from time.Now, as
// context.WithTimeout makes it), else on the wall clock.
func Instant(t time.Time) int64 { return int64(t.Sub(epoch)) }

// Time is instant n as a time.Time, with a monotonic reading unless n is too
// far away to carry one.
func Time(n int64) time.Time { return epoch.Add(time.Duration(n)) }

// AddSat is a+d for an instant a and a duration d ≥ 0, saturated at
// math.MaxInt64 ("never"): a Tuning or DefaultTimeout of hundreds of years
// must not overflow into the past.
func AddSat(a, d int64) int64 {
	if a > math.MaxInt64-d {
		return math.MaxInt64
	}
	return a + d
}
