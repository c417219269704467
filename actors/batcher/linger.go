package batcher

import (
	"math"

	"github.com/ankusa/sinkbatch/internal/mono"
)

// This file holds the linger under load (see codec.Tuning.Linger).
//
// A batch waits Linger after its first message. That is the right wait
// while requests are quick; but when a destination's requests take
// longer than Linger and the instance has more requests in flight than one
// destination may have (MaxInflight), the requests are queueing for
// something the destinations share (the process's CPU, a server, a
// connection), and every request a batch saves is time given back to all of
// them. Then a batch lingers as long as its destination's requests take (the
// mean request time), at most stretchMax × Linger: while one request is on
// its way the next one gathers. A destination on its own never meets the
// condition (its requests in flight never exceed its MaxInflight), so a
// lightly loaded instance keeps Linger's promise: a lone caller's message
// leaves Linger after it arrives, whatever the request time.
//
// Like the queue, the rule reads no clock and no shared state: the request
// times and the instance's requests in flight come in as arguments.
type stretch struct {
	linger int64 // Tuning.Linger, nanoseconds
	most   int64 // stretchMax × linger
	own    int   // Tuning.MaxInflight
	rtt    ewma  // this destination's successful request times, nanoseconds
}

// stretchMax bounds the linger under load, in Lingers.
const stretchMax = 64

func newStretch(linger int64, maxInflight int) stretch {
	most := int64(math.MaxInt64)
	if linger < most/stretchMax {
		most = linger * stretchMax
	}
	return stretch{linger: linger, most: most, own: maxInflight}
}

// ended notes a request that took rtt nanoseconds; only a successful one
// says how long requests take.
func (s *stretch) ended(rtt int64, ok bool) {
	if ok {
		s.rtt.update(float64(rtt))
	}
}

// wait is how long a batch lingers while the instance has
// instanceInflight requests in flight.
func (s *stretch) wait(instanceInflight int64) int64 {
	if instanceInflight <= int64(s.own) || !s.rtt.set || s.rtt.mean <= float64(s.linger) {
		return s.linger
	}
	return min(int64(s.rtt.mean), s.most)
}

// lingerEnd is when the batch being gathered is due by lingering: Linger
// after lingerFrom; stretched, lingerNow after it, but no later than a
// request time (lingerNow) before the earliest deadline of a queued entry,
// so that the stretch does not let it expire unsent, and never before
// Linger.
func (q *queue) lingerEnd() int64 {
	end := mono.AddSat(q.lingerFrom, q.lingerNow)
	if q.lingerNow > q.s.linger && q.minDeadline != math.MaxInt64 {
		end = min(end, max(mono.AddSat(q.lingerFrom, q.s.linger), q.minDeadline-q.lingerNow))
	}
	return end
}
