package batcher

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A batch lingers longer than Linger only while the instance has more
// requests in flight than the destination may have and the destination's
// requests take longer than Linger; then as long as they take, up to
// stretchMax Lingers.
func TestLingerStretchesOnlyUnderLoad(t *testing.T) {
	const linger, own = 5 * ms, 8
	for _, tc := range []struct {
		name     string
		rtts     []int64 // successful request times, in order
		failed   int64   // a failed request's time, after them
		instance int64   // the instance's requests in flight
		want     int64
	}{
		{name: "no request yet", instance: 100, want: linger},
		{name: "a lone destination's slow requests", rtts: []int64{200 * ms}, instance: own, want: linger},
		{name: "quick requests on a loaded instance", rtts: []int64{4 * ms}, instance: 100, want: linger},
		{name: "slow requests on a loaded instance", rtts: []int64{30 * ms}, instance: own + 1, want: 30 * ms},
		{name: "the mean request time", rtts: []int64{30 * ms, 10 * ms}, instance: 100, want: 22 * ms},
		{name: "at most stretchMax Lingers", rtts: []int64{time.Second.Nanoseconds()}, instance: 100, want: stretchMax * linger},
		{name: "a failed request says nothing", rtts: []int64{30 * ms}, failed: time.Second.Nanoseconds(), instance: 100, want: 30 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStretch(linger, own)
			for _, rtt := range tc.rtts {
				s.ended(rtt, true)
			}
			if tc.failed > 0 {
				s.ended(tc.failed, false)
			}
			assert.Equal(t, tc.want, s.wait(tc.instance))
		})
	}
	t.Run("a Linger too long to stretch", func(t *testing.T) {
		s := newStretch(math.MaxInt64/2, own)
		s.ended(math.MaxInt64/2+1, true)
		assert.Equal(t, int64(math.MaxInt64), s.most, "no overflow into the past")
		assert.GreaterOrEqual(t, s.wait(100), int64(math.MaxInt64/2))
	})
}

// lingerDispatch is a dispatch whose destination may have 2 requests in
// flight, on an instance with instance requests in flight, whose last
// request took rtt; it holds nothing.
func lingerDispatch(t *testing.T, instance, rtt int64) *dispatch {
	t.Helper()
	d := handoffDispatch(testSettings())
	d.stretch = newStretch(d.q.s.linger, d.q.s.maxInflight)
	d.instance = &atomic.Int64{}
	d.instance.Store(instance)
	const t0 = 1000 * ms
	_, ok := d.q.admit(mk("a", "", 1, 1), t0)
	require.True(t, ok)
	launched, _, _ := d.step(t0+d.q.s.linger, nil)
	require.Len(t, launched, 1)
	r := d.finishWith(launched[0], t0+d.q.s.linger+rtt, outcome{rtt: rtt, ok: true})
	require.Nil(t, r.next)
	return d
}

// On an instance with more requests in flight than the destination may
// have, a batch of a destination whose requests take 30ms waits 30ms, not
// Linger (5ms), but leaves a request time before its earliest deadline
// (never before Linger); on an instance with no more than that, it leaves
// after Linger, however long the requests take.
func TestABatchWaitsAsLongAsARequestTakesWhileTheInstanceIsLoaded(t *testing.T) {
	const t1 = 2000 * ms
	for _, tc := range []struct {
		name     string
		instance int64
		deadline int64 // the entry's, after t1; 0: none
		wait     int64
	}{
		{name: "loaded", instance: 3, wait: 30 * ms},
		{name: "alone", instance: 2, wait: 5 * ms},
		{name: "loaded, a deadline a request time and 10ms away", instance: 3, deadline: 40 * ms, wait: 10 * ms},
		{name: "loaded, a deadline within a request time", instance: 3, deadline: 20 * ms, wait: 5 * ms},
		{name: "alone, a deadline within a request time", instance: 2, deadline: 20 * ms, wait: 5 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := lingerDispatch(t, tc.instance, 30*ms)
			e := mk("b", "", 1, 1)
			if tc.deadline > 0 {
				e.deadline = t1 + tc.deadline
			}
			_, ok := d.q.admit(e, t1)
			require.True(t, ok)
			launched, _, st := d.step(t1+tc.wait-1, nil)
			assert.Empty(t, launched, "not due before the wait")
			assert.Equal(t, t1+tc.wait, st.wake, "the actor wakes when it is due")
			launched, _, _ = d.step(t1+tc.wait, nil)
			require.Len(t, launched, 1, "due once the wait is over")
			assert.Equal(t, []string{"b//1"}, refs(launched[0].entries))
		})
	}
}
