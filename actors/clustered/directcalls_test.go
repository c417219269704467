package clustered

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
)

// TestDirectCallsAnswerOnlyItsOwnDelivery: a call recycled and added again
// for another delivery is not answered by what was meant for the first
// (an instance answering late, after its caller gave up).
func TestDirectCallsAnswerOnlyItsOwnDelivery(t *testing.T) {
	var dc directCalls
	c := newDirectCall()
	first, ok := dc.add(c)
	require.True(t, ok)
	require.True(t, dc.abandon(c), "the caller gives up while it waits")
	dc.remove(c)

	second, ok := dc.add(c)
	require.True(t, ok)
	require.NotEqual(t, first, second)
	dc.answer(c, first, codec.Result{ID: "late, for the first delivery"})
	assert.Empty(t, c.answer, "an answer for an earlier delivery is dropped")

	dc.answer(c, second, codec.Result{ID: "mine"})
	dc.answer(c, second, codec.Result{ID: "again"})
	require.Len(t, c.answer, 1, "answered once")
	a := <-c.answer
	assert.Equal(t, answered, a.outcome)
	assert.Equal(t, "mine", a.result.ID)
	assert.False(t, dc.abandon(c), "answered: its caller must take the answer")
	dc.remove(c)
	assert.Equal(t, uint64(2), dc.added())
}

// TestDirectCallsFailAnswersWhatWaitsOnce: fail answers the calls that
// wait, not those answered or abandoned before, and none twice, however
// it races the instance's answers and the callers giving up.
func TestDirectCallsFailAnswersWhatWaitsOnce(t *testing.T) {
	for round := range 200 {
		var dc directCalls
		const n = 40
		cs := make([]*directCall, n)
		tokens := make([]uint64, n)
		for i := range cs {
			cs[i] = &directCall{answer: make(chan directAnswer, 1)}
			var ok bool
			tokens[i], ok = dc.add(cs[i])
			require.True(t, ok)
		}
		abandoned := make([]bool, n)
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i += 2 {
				dc.answer(cs[i], tokens[i], codec.Result{ID: "sent"})
			}
		}()
		go func() {
			defer wg.Done()
			for i := 1; i < n; i += 4 {
				abandoned[i] = dc.abandon(cs[i])
			}
		}()
		go func() {
			defer wg.Done()
			dc.fail(memberLeft, false)
		}()
		wg.Wait()
		for i, c := range cs {
			if abandoned[i] {
				assert.Empty(t, c.answer, "round %d: call %d, abandoned, is not answered", round, i)
				continue
			}
			// A send beyond the first would have blocked fail or answer:
			// the channel holds one.
			require.Len(t, c.answer, 1, "round %d: call %d is answered once", round, i)
			a := <-c.answer
			if i%2 == 1 {
				assert.Equal(t, memberLeft, a.outcome, "round %d: call %d, never answered by the instance", round, i)
			}
			dc.remove(c)
		}
	}
}

// TestDirectCallsQuitRacingAdd: a call added while Leave gives up is either
// refused (not admitted) or answered nodeQuit by fail; never admitted and
// left waiting once fail has returned.
func TestDirectCallsQuitRacingAdd(t *testing.T) {
	for round := range 500 {
		var dc directCalls
		const n = 8
		cs := make([]*directCall, n)
		oks := make([]bool, n)
		var wg sync.WaitGroup
		for i := range cs {
			cs[i] = &directCall{answer: make(chan directAnswer, 1)}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, oks[i] = dc.add(cs[i])
			}()
		}
		dc.fail(nodeQuit, true)
		wg.Wait()
		for i, c := range cs {
			if !oks[i] {
				continue
			}
			require.Len(t, c.answer, 1, "round %d: call %d was admitted, so fail must have answered it", round, i)
			assert.Equal(t, nodeQuit, (<-c.answer).outcome)
		}
		c := &directCall{answer: make(chan directAnswer, 1)}
		_, ok := dc.add(c)
		assert.False(t, ok, "round %d: added after fail with quit", round)
	}
}
