package actors_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
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

// crasher is a batcher.Listener whose Listening panics: a Deliver naming
// it, sent to the instance's PID, restarts the destination's batcher (the
// batcher asks it in its Receive). Its answers are dropped.
type crasher struct{ n atomic.Int64 }

func (c *crasher) Listening(*actor.PID) bool {
	c.n.Add(1)
	panic("Listening panics")
}
func (*crasher) Answer(*actor.PID, codec.Result) {}

// strictSetup starts an instance and a StrictGroups destination whose
// codec fails bodies starting "fail" retryably and answers the others with
// ids made of their bodies, and returns a Deliver for it.
func strictSetup(t *testing.T, name string) (*actor.ActorSystem, *actors.Instance, *fakecodec.Codec, func(group, body string) (string, error)) {
	const within = 10 * time.Second
	system, inst := start(t, actors.Config{Name: name})
	c := flakyStrictCodec(name, 0)
	deliver := func(group, body string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return inst.Deliver(ctx, c, codec.Message{Tenant: "t", Group: group, IdempotencyKey: body, Body: []byte(body)})
	}
	return system, inst, c, deliver
}

// Tuning.StrictGroups: "a retryable failure of a message pauses its group
// until the message is retried, the group is resumed, or GroupPauseMax
// passes"; Instance.ResumeGroup: "its next delivery is admitted again". A
// caller that gets a retryable failure, gives that message up and resumes
// the group at once (ResumeGroup returns nil) must find its next delivery
// of the group admitted, not answered GroupPausedError for the 30 s of
// GroupPauseMax: the pause must be in place when the failure is answered,
// or the resume finds nothing to resume and the pause lands after it.
func TestResumeGroupRightAfterTheFailure(t *testing.T) {
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	_, inst, c, deliver := strictSetup(t, "resumeat")
	bg := context.Background()
	lost := 0
	for r := range rounds {
		_, err := deliver("g", fmt.Sprint("fail-", r))
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee)
		require.Equal(t, "Flaky", ee.Code)
		require.NoError(t, inst.ResumeGroup(bg, c, "g"), "round %d", r)
		id, err := deliver("g", fmt.Sprint("next-", r))
		var gp *messages.GroupPausedError
		if errors.As(err, &gp) {
			lost++
			// The group is paused after all: resume it for the next round.
			require.Eventually(t, func() bool {
				p, _ := inst.PausedGroups(bg, c)
				return len(p) == 1
			}, time.Second, time.Millisecond)
			require.NoError(t, inst.ResumeGroup(bg, c, "g"))
			continue
		}
		if assert.NoError(t, err, "round %d", r) {
			assert.Equal(t, fmt.Sprint("id-next-", r), id)
		}
	}
	assert.Zero(t, lost, "in %d of %d rounds the group was paused after ResumeGroup returned: the failure was answered before its group paused", lost, rounds)
}

// Instance.ResumeGroup: "its next delivery is admitted again". A group
// paused after a retryable failure (StrictGroups), with nothing of it
// queued, is resumed while the destination's batcher restarts (a panic in
// its Receive): the restart carries the paused groups to the next
// incarnation, and a resume that lands between the old incarnation handing
// them over and the new one taking them must not be lost. After each
// ResumeGroup that returned nil, the group is not paused and its next
// delivery is sent.
func TestResumeGroupDuringARestart(t *testing.T) {
	const within = 10 * time.Second
	rounds := 600
	if testing.Short() {
		rounds = 50
	}
	system, inst, c, deliver := strictSetup(t, "resume")
	crash := &crasher{}
	bg := context.Background()
	lost := 0
	for r := range rounds {
		// Pause g: its message fails retryably.
		_, err := deliver("g", fmt.Sprint("fail-", r))
		require.Error(t, err)
		require.False(t, codec.IsPermanent(err))
		// The pause may land just after the answer (see
		// TestResumeGroupRightAfterTheFailure): wait for it.
		require.Eventually(t, func() bool {
			p, _ := inst.PausedGroups(bg, c)
			return len(p) == 1 && p[0] == "g"
		}, within, 100*time.Microsecond, "round %d: g paused after its failure", r)

		// Restart the batcher and resume g at the same moment.
		var wg sync.WaitGroup
		wg.Go(func() {
			d := &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "t", Body: []byte("crash")}, Deadline: time.Now().Add(within)}
			d.Ref = &batcher.Direct{Listener: crash, Sender: &actor.PID{Address: system.Address(), Id: "crash", RequestId: 1}}
			system.Root.Send(inst.PID(), d)
		})
		wg.Go(func() {
			if r%3 != 0 {
				time.Sleep(time.Duration(r%50) * time.Microsecond) // spread the resume over the restart
			}
			assert.NoError(t, inst.ResumeGroup(bg, c, "g"))
		})
		wg.Wait()
		// A delivery of another group, through the same mailbox: once it
		// is answered, the restart is over.
		id, err := deliver("other", fmt.Sprint("after-", r))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("id-after-", r), id)

		paused, err := inst.PausedGroups(bg, c)
		require.NoError(t, err)
		if len(paused) > 0 {
			lost++
			// Resume it for the next round, as a caller that noticed would.
			require.NoError(t, inst.ResumeGroup(bg, c, "g"))
			continue
		}
		id, err = deliver("g", fmt.Sprint("next-", r))
		if assert.NoError(t, err, "round %d: g's next delivery after ResumeGroup", r) {
			assert.Equal(t, fmt.Sprint("id-next-", r), id)
		}
		var gp *messages.GroupPausedError
		assert.False(t, errors.As(err, &gp))
	}
	assert.Positive(t, crash.n.Load(), "the batcher was made to restart")
	assert.Zero(t, lost, "in %d of %d rounds a ResumeGroup that returned nil during a restart was lost: the group stayed paused", lost, rounds)
}
