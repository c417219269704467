//go:build !race

package clustered_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// strictCodec is a StrictGroups destination that fails a message whose
// body starts "flaky" retryably the first time it sees its idempotency key,
// and accepts everything else.
func strictCodec(name string) codec.Codec {
	c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond, StrictGroups: true}
	var mu sync.Mutex
	seen := map[string]bool{}
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			res[i] = codec.Result{ID: "id-" + string(m.Body)}
			if strings.HasPrefix(string(m.Body), "flaky") && !seen[m.IdempotencyKey] {
				seen[m.IdempotencyKey] = true
				res[i] = codec.Result{Err: &codec.EntryError{Code: "Flaky"}}
			}
		}
		return res, nil
	}
	return c
}

// Tuning.StrictGroups holds cluster-wide: a message that fails retryably,
// from a caller on one member, pauses its group for the callers of every
// member (each is answered *messages.GroupPausedError naming the failed
// message's key, and nothing of the group is sent), and the failed
// message's retry, from yet another member, resumes it. The destination
// receives the group in the order its callers saw it answered.
func TestAdv13StrictGroupPausesAndResumesAcrossMembers(t *testing.T) {
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodec})
	owner, _ := ownerOf(t, ms, "strict")
	var others []*member
	for _, m := range ms {
		if m != owner {
			others = append(others, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := func(body, key string) codec.Message {
		return codec.Message{Tenant: "t", Group: "g", IdempotencyKey: key, Body: []byte(body)}
	}
	_, err := others[0].node.Deliver(ctx, "strict", msg("first", "k0"))
	require.NoError(t, err)
	_, err = others[0].node.Deliver(ctx, "strict", msg("flaky", "k1"))
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	assert.False(t, codec.IsPermanent(err))
	for i, m := range []*member{owner, others[0], others[1]} {
		_, err := m.node.Deliver(ctx, "strict", msg("held", "k2"))
		var gp *messages.GroupPausedError
		require.ErrorAs(t, err, &gp, "member %d", i)
		assert.Equal(t, messages.GroupPausedError{Group: "g", Key: "k1"}, *gp)
	}
	// Another group is not held.
	_, err = others[1].node.Deliver(ctx, "strict", codec.Message{Tenant: "t", Group: "h", Body: []byte("other-group")})
	require.NoError(t, err)
	id, err := others[1].node.Deliver(ctx, "strict", msg("flaky", "k1"))
	require.NoError(t, err, "the failed message's retry, from another member")
	assert.Equal(t, "id-flaky", id)
	for i, m := range []*member{owner, others[0]} {
		_, err := m.node.Deliver(ctx, "strict", msg("after", "k3"))
		require.NoError(t, err, "member %d, after the resume", i)
	}
	var bodies []string
	for _, s := range owner.fake("strict").Sent() {
		if s.Group == "g" {
			bodies = append(bodies, string(s.Body))
		}
	}
	assert.Equal(t, []string{"first", "flaky", "after", "after"}, bodies)
	for _, m := range others {
		assert.Empty(t, m.fake("strict").Sent(), "a non-owner's codec sent")
	}
}

// Node.ResumeGroup and PausedGroups reach the pause wherever the caller
// is: a group paused by a failure from one member's caller is listed by
// every member, resumed from a member that does not own the destination,
// and its next delivery, from any member, is then admitted although the
// failed message was never retried.
func TestAdv13ResumeGroupFromAnyMember(t *testing.T) {
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodec})
	owner, _ := ownerOf(t, ms, "strict")
	var others []*member
	for _, m := range ms {
		if m != owner {
			others = append(others, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := func(body, key string) codec.Message {
		return codec.Message{Tenant: "t", Group: "g", IdempotencyKey: key, Body: []byte(body)}
	}
	for round, resumer := range []*member{others[1], owner, others[0]} {
		key := fmt.Sprint("k", round)
		_, err := others[0].node.Deliver(ctx, "strict", msg("flaky", key))
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee, "round %d", round)
		for i, m := range ms {
			paused, err := m.node.PausedGroups(ctx, "strict")
			require.NoError(t, err, "round %d, member %d", round, i)
			assert.Equal(t, []string{"g"}, paused, "round %d, member %d", round, i)
		}
		_, err = others[1].node.Deliver(ctx, "strict", msg("held", "h"+key))
		var gp *messages.GroupPausedError
		require.ErrorAs(t, err, &gp, "round %d", round)
		require.NoError(t, resumer.node.ResumeGroup(ctx, "strict", "g"), "round %d", round)
		for i, m := range ms {
			paused, err := m.node.PausedGroups(ctx, "strict")
			require.NoError(t, err)
			assert.Empty(t, paused, "round %d, member %d, after the resume", round, i)
		}
		id, err := others[1].node.Deliver(ctx, "strict", msg("next", "n"+key))
		require.NoError(t, err, "round %d: the group's next delivery after ResumeGroup", round)
		assert.Equal(t, "id-next", id)
	}
	// Resuming a group that is not paused does nothing, and is no error.
	require.NoError(t, others[0].node.ResumeGroup(ctx, "strict", "never-paused"))
	_, err := others[0].node.PausedGroups(ctx, "nowhere")
	assert.ErrorIs(t, err, clustered.ErrUnknownDestination)
	assert.ErrorIs(t, others[0].node.ResumeGroup(ctx, "nowhere", "g"), clustered.ErrUnknownDestination)
	//nolint:staticcheck // a nil ctx is the bad input under test
	assert.ErrorIs(t, others[0].node.ResumeGroup(nil, "strict", "g"), actors.ErrNilContext)
}

// flagUnfixed runs the tests of known bugs main has not fixed yet, which
// otherwise skip themselves (as internal/adversary's -adversary.unfixed).
var flagUnfixed = flag.Bool("clustered.unfixed", false, "also run the tests of known bugs main has not fixed yet")

// Tuning.StrictGroups: a paused group stays paused until its failed
// message is retried, ResumeGroup, or GroupPauseMax, and a batcher's
// restart keeps it paused. Across a hand-off it does not: the paused
// groups live in the old owner's batcher, the hand-off carries none of
// them, and the new owner's batcher sends the group's next message before
// the failed one's retry. KNOWN BUG, not fixed: see doc.go, "Guarantees".
func TestAdv13StrictGroupPauseSurvivesAHandOff(t *testing.T) {
	if !*flagUnfixed {
		t.Skip("known bug, not fixed: a hand-off drops the paused groups (run with -clustered.unfixed)")
	}
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodec})
	owner, _ := ownerOf(t, ms, "strict")
	var rest []*member
	for _, m := range ms {
		if m != owner {
			rest = append(rest, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := func(body, key string) codec.Message {
		return codec.Message{Tenant: "t", Group: "g", IdempotencyKey: key, Body: []byte(body)}
	}
	_, err := rest[0].node.Deliver(ctx, "strict", msg("flaky", "k1"))
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	owner.leave(t)
	waitMembers(t, rest, 2)
	_, err = rest[1].node.Deliver(ctx, "strict", msg("held", "k2"))
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp, "the group's next message, after the hand-off, before the failed one's retry")
	assert.Equal(t, "k1", gp.Key)
}
