package actors_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
)

func groupNames(n int) []string {
	gs := make([]string, n)
	for i := range gs {
		gs[i] = fmt.Sprintf("g%02d", i)
	}
	return gs
}

// checkStrictGroups runs the property StrictGroups promises with it on and
// off. dest makes one run's destination: the Faults its servers inject, a
// codec with StrictGroups as given, and what the server stored. Each group's
// messages go through retrying Callers; with StrictGroups every group is
// stored in the order its caller first delivered it, without it the
// followers of a failed message overtake its retry.
func checkStrictGroups(t *testing.T, dest func(t *testing.T, strict bool) (*Faults, codec.Codec, func() map[string][]string)) {
	groups := groupNames(8)
	const per = 60
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			f, c, stored := dest(t, strict)
			system, inst := start(t, actors.Config{Name: "strict"})
			retries := Callers(t, system, inst.PID(), c, groups, per)
			paused, err := inst.PausedGroups(context.Background(), c)
			require.NoError(t, err)
			assert.Empty(t, paused, "every failed message was retried: no group stays paused")
			bad, missing := Violations(stored(), groups, per)
			t.Logf("strict=%v: %d failures injected, %d retries, %d stored out of order", strict, f.Struck.Load(), retries, bad)
			assert.Zero(t, missing, "every message is stored")
			require.Positive(t, f.Struck.Load(), "failures were injected")
			if strict {
				assert.Zero(t, bad, "stored out of first-delivery order")
			} else {
				assert.Positive(t, bad, "without StrictGroups followers overtake the retry")
			}
		})
	}
}

// The property StrictGroups promises, on a real SQS FIFO queue (fauxqs):
// a caller that retries each failed or paused message, in its own order,
// with the same key, sees each group stored in the order it first delivered
// it, under random whole-request and per-entry failures. Without
// StrictGroups the same run stores followers before the failed message's
// retry: the test would catch a broken promise.
func TestStrictGroupsKeepOrderAcrossFailuresSQS(t *testing.T) {
	checkStrictGroups(t, func(t *testing.T, strict bool) (*Faults, codec.Codec, func() map[string][]string) {
		f := NewFaults(0.05, 0.05, 1)
		q := NewSQS(t, f)
		return f, q.Codec(t, codec.Tuning{StrictGroups: strict}), func() map[string][]string { return q.Stored(t) }
	})
}

// The same property with Pub/Sub ordering keys (pstest), whose Publish
// succeeds or fails as a whole.
func TestStrictGroupsKeepOrderAcrossFailuresPubSub(t *testing.T) {
	checkStrictGroups(t, func(t *testing.T, strict bool) (*Faults, codec.Codec, func() map[string][]string) {
		f := NewFaults(0.1, 0, 2)
		p := NewPubSub(t, f)
		return f, p.Codec(t, codec.Tuning{StrictGroups: strict, MaxEntries: 5}), p.Stored
	})
}
