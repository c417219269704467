package batcher

// This file holds the adaptive in-flight limit (Tuning.Adaptive): an AIMD
// controller on request time, after Vector's adaptive request concurrency
// (src/sinks/util/adaptive_concurrency/controller.rs in vectordotdev/vector),
// with one change that keeps the limit below the destination's knee.
//
// The limit starts at 1. The request times of successful requests are
// averaged over a window limiterWindow request times long (a request time
// being, as Vector's, the exponentially weighted mean of past windows). At
// the end of each window the window's mean is compared with the baseline:
//   - the limit grows by 1 if the window's requests reached the limit (there
//     was demand for more), none met back pressure, and the window's mean is
//     within limiterGood of the baseline;
//   - it shrinks to ⌊limit × 0.9⌋ (at least by 1, never below 1) if a
//     request met back pressure (the destination throttled it, or it ran
//     out of time), or the window's mean is limiterBad times the baseline
//     or more.
//
// Vector's baseline is the exponentially weighted mean of past windows, and
// it calls a window slow past that mean plus 2.5 standard deviations. That
// baseline follows request time up as the limit creeps past the knee one
// step at a time, each step within the deviation, until the destination
// throttles. Here the baseline is the no-load request time: the lowest
// window mean seen, and the limit it was seen at. A window whose mean is
// higher at that limit or a lower one says the destination itself became
// slower (load cannot explain it), and the baseline moves toward it as an
// exponentially weighted mean; a higher mean at a higher limit is load, and
// leaves it. Like the queue, the limiter reads no clock: now comes in as an
// argument.
type limiter struct {
	limit int // the current limit, 1 ≤ limit ≤ max
	max   int // Tuning.MaxInflight

	past       ewma    // past windows' mean request times, in seconds: the window length
	noLoad     float64 // the baseline, in seconds; 0 until the first window
	noLoadAt   int     // the limit the baseline was seen at
	windowSum  float64 // this window's successful request times, in seconds
	windowN    int
	nextUpdate int64 // when the window ends (internal/mono)
	pressured  bool  // a request in this window met back pressure
	reached    bool  // requests in flight reached the limit in this window
}

// The controller's constants.
const (
	limiterAlpha    = 0.4  // weight of the newest window in the window length (Vector's)
	limiterDecrease = 0.9  // multiplicative decrease (Vector's)
	limiterGood     = 1.25 // a window this close to the baseline may grow the limit
	limiterBad      = 1.3  // a window this far above the baseline shrinks it
	// limiterWindow is the window's length in mean request times. Vector's
	// is 1; 2 halves the noise of a window's mean at a small limit, where a
	// window holds few requests.
	limiterWindow = 2
)

func newLimiter(max int) *limiter { return &limiter{limit: 1, max: max} }

// started notes a request leaving, with inflight requests in flight
// counting it.
func (l *limiter) started(inflight int) {
	if inflight >= l.limit {
		l.reached = true
	}
}

// ended adjusts to a request that ended at now after rtt nanoseconds. ok:
// it succeeded, so rtt is a sample; pressured: the destination pushed back
// (throttling, a deadline). It reports whether the limit changed.
func (l *limiter) ended(now, rtt int64, ok, pressured bool) bool {
	if pressured {
		l.pressured = true
	}
	if ok {
		l.windowSum += float64(rtt) / 1e9
		l.windowN++
	}
	cur, haveCur := 0.0, l.windowN > 0
	if haveCur {
		cur = l.windowSum / float64(l.windowN)
	}
	if !l.past.set {
		if haveCur {
			l.past.update(cur)
			l.noLoad, l.noLoadAt = cur, l.limit
			l.nextUpdate = now + int64(limiterWindow*cur*1e9)
			l.windowSum, l.windowN = 0, 0
		} else if l.pressured && l.limit > 1 {
			return l.decrease()
		}
		return false
	}
	if now < l.nextUpdate {
		return false
	}
	before := l.limit
	switch {
	case l.limit < l.max && l.reached && !l.pressured && haveCur && cur <= l.noLoad*limiterGood:
		l.limit++
	case l.limit > 1 && (l.pressured || (haveCur && cur >= l.noLoad*limiterBad)):
		l.decrease()
	}
	if haveCur {
		l.past.update(cur)
		switch {
		case cur < l.noLoad:
			l.noLoad, l.noLoadAt = cur, before
		case before <= l.noLoadAt:
			l.noLoad += limiterAlpha * (cur - l.noLoad)
			l.noLoadAt = before
		}
	}
	l.nextUpdate = now + int64(limiterWindow*l.past.mean*1e9)
	l.windowSum, l.windowN = 0, 0
	l.pressured, l.reached = false, false
	return l.limit != before
}

func (l *limiter) decrease() bool {
	l.limit = max(int(float64(l.limit)*limiterDecrease), 1)
	return true
}

// ewma is an exponentially weighted mean.
type ewma struct {
	mean float64
	set  bool
}

func (e *ewma) update(x float64) {
	if !e.set {
		e.mean, e.set = x, true
		return
	}
	e.mean += limiterAlpha * (x - e.mean)
}
