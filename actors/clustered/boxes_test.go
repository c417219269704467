package clustered

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPost is a post of boxes[int, *testPost]: items are their own size.
type testPost struct{ to string }

func testBoxes(budget int) *boxes[int, *testPost] {
	return &boxes[int, *testPost]{m: map[pidKey]*box[int, *testPost]{}, size: func(v int) int { return v }, budget: budget, newPost: newTestPost}
}

func newTestPost(b *box[int, *testPost]) *testPost { return &testPost{to: b.key.id} }

// The rules of boxes that keep what is written to a member under gRPC's
// limit (see boxes), driven directly.
func TestBoxesKeepOnePostOnItsWayToAMember(t *testing.T) {
	now := time.Now()
	a, b, c := pidKey{"m1", "a"}, pidKey{"m1", "b"}, pidKey{"m2", "c"}

	t.Run("one post on its way per member, and the next when it is taken", func(t *testing.T) {
		bs := testBoxes(100)
		pa, _, made := bs.add(a, true, "", 1, now)
		require.True(t, made)
		_, _, made = bs.add(b, true, "", 2, now)
		assert.False(t, made, "b waits: a's post is on its way to m1")
		_, _, made = bs.add(a, true, "", 3, now)
		assert.False(t, made, "a's post will take it")
		pc, _, made := bs.add(c, true, "", 4, now)
		require.True(t, made, "another member has a gate of its own")
		taken, next, stale := bs.take(bs.m[a], pa, true, now)
		assert.Equal(t, []int{1, 3}, taken)
		require.NotNil(t, next, "taking a's post opens the gate for b")
		assert.Equal(t, "b", next.to)
		assert.Nil(t, stale)
		taken, next, _ = bs.take(bs.m[b], next, true, now)
		assert.Equal(t, []int{2}, taken)
		assert.Nil(t, next, "nothing waits")
		taken, _, _ = bs.take(bs.m[c], pc, true, now)
		assert.Equal(t, []int{4}, taken)
		assert.Empty(t, bs.m)
		assert.Empty(t, bs.gate)
	})

	t.Run("a post takes at most the budget, and at least one item", func(t *testing.T) {
		bs := testBoxes(100)
		p, _, _ := bs.add(a, true, "", 150, now)
		for _, v := range []int{40, 40, 30, 10} {
			bs.add(a, true, "", v, now)
		}
		taken, next, _ := bs.take(bs.m[a], p, true, now)
		assert.Equal(t, []int{150}, taken, "one item above the budget goes alone")
		require.NotNil(t, next, "the rest gets a post of its own")
		taken, next, _ = bs.take(bs.m[a], next, true, now)
		assert.Equal(t, []int{40, 40}, taken)
		require.NotNil(t, next)
		taken, next, _ = bs.take(bs.m[a], next, true, now)
		assert.Equal(t, []int{30, 10}, taken)
		assert.Nil(t, next)
		assert.Empty(t, bs.m)
	})

	t.Run("uncapped takes all", func(t *testing.T) {
		bs := testBoxes(10)
		p, _, _ := bs.add(a, false, "", 40, now)
		bs.add(a, false, "", 40, now)
		taken, _, _ := bs.take(bs.m[a], p, false, now)
		assert.Equal(t, []int{40, 40}, taken)
	})

	t.Run("boxes on this member have no gate", func(t *testing.T) {
		bs := testBoxes(100)
		_, _, made := bs.add(a, false, "", 1, now)
		require.True(t, made)
		_, _, made = bs.add(b, false, "", 1, now)
		assert.True(t, made)
	})

	t.Run("a post given up opens the gate", func(t *testing.T) {
		bs := testBoxes(100)
		pa, _, _ := bs.add(a, true, "", 1, now)
		bs.add(b, true, "", 2, now)
		gone, next, _ := bs.abandon(bs.m[a], pa, now)
		assert.Equal(t, []int{1}, gone)
		require.NotNil(t, next)
		assert.Equal(t, "b", next.to)
	})

	t.Run("a stalled post does not hold the gate", func(t *testing.T) {
		bs := testBoxes(100)
		bs.add(a, true, "", 1, now)
		_, _, made := bs.add(b, true, "", 2, now.Add(stalledPost))
		assert.True(t, made)
	})

	t.Run("a replaced post takes nothing; its replacement takes the box", func(t *testing.T) {
		bs := testBoxes(100)
		old, _, _ := bs.add(a, true, "", 60, now)
		later := now.Add(stalledPost)
		p, stale, made := bs.add(a, true, "", 60, later)
		require.True(t, made)
		assert.Same(t, old, stale)
		taken, next, _ := bs.take(bs.m[a], old, true, later)
		assert.Empty(t, taken, "the stalled post, written late, carries nothing")
		assert.Nil(t, next, "and does not open the gate its replacement holds")
		taken, next, _ = bs.take(bs.m[a], p, true, later)
		assert.Equal(t, []int{60}, taken, "one budget at a time")
		require.NotNil(t, next)
		taken, _, _ = bs.take(bs.m[a], next, true, later)
		assert.Equal(t, []int{60}, taken)
	})

	t.Run("a member cut off leaves no gate", func(t *testing.T) {
		bs := testBoxes(100)
		bs.add(a, true, "", 1, now)
		bs.cut("m1")
		_, _, made := bs.add(b, true, "", 2, now)
		assert.True(t, made)
	})
}
