package batcher

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With StrictGroups, a group whose entry's caller left before its request
// was sent stores nothing later of that group before the left entry's
// retry: not even a follower in the same batch whose deadline passed in
// flight (the actor answered it DeadlineExceeded, "may have been stored",
// so leaving it unsent keeps that promise too).
func TestStrictALeftEntryIsNotOvertakenByAFollowerThatExpiredInFlight(t *testing.T) {
	s := strictSettings()
	s.maxEntries = 10
	d := handoffDispatch(s)
	now := int64(1000)
	k1, k2 := keyed("a", "g", 1, "k1"), keyed("a", "g", 2, "k2")
	k2.deadline = now + 10
	require.True(t, d.admit(k1, now, false).ok)
	require.True(t, d.admit(k2, now, false).ok)
	f, _ := launchAt(d, now)
	require.Equal(t, []string{"a/g/1", "a/g/2"}, refs(f.entries))

	// k2's deadline passes in flight: the actor claims and answers it.
	late, _ := d.expire(now + 10)
	require.Equal(t, []string{"a/g/2"}, refs(late))
	// Then the request goroutine finds k1's caller gone.
	d.leave(f, []bool{true, false}, now+10)

	var stored []string
	for _, e := range f.entries {
		stored = append(stored, e.msg.IdempotencyKey)
	}
	d.finishWith(f, now+10, outcome{})
	// Both callers retry, in their own order, with the same keys.
	for _, k := range []struct {
		n   int
		key string
	}{{1, "k1"}, {2, "k2"}} {
		a := admitKeyed(d, "g", k.n, k.key, now+20)
		require.True(t, a.ok, "the retry of %s is admitted", k.key)
	}
	stored = append(stored, sendAll(d, now+20)...)
	assert.Equal(t, []string{"k1", "k2"}, firstDeliveries(stored), "g stored in the order it was first delivered")
}

// firstDeliveries is keys with every key after its first occurrence
// removed.
func firstDeliveries(keys []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
