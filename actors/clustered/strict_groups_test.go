//go:build !race

package clustered_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// strictCodecs makes StrictGroups destinations that fail a message whose
// body starts "flaky" retryably the first time any of them sees its
// idempotency key (one destination, as every member's codec for it), and
// accept everything else.
func strictCodecs() func(name string) codec.Codec {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: time.Millisecond, StrictGroups: true}
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			mu.Lock()
			defer mu.Unlock()
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				res[i] = codec.Result{ID: "id-" + string(m.Body)}
				if strings.HasPrefix(string(m.Body), "flaky") && !seen[name+"/"+m.IdempotencyKey] {
					seen[name+"/"+m.IdempotencyKey] = true
					res[i] = codec.Result{Err: &codec.EntryError{Code: "Flaky"}}
				}
			}
			return res, nil
		}
		return c
	}
}

// groupMsg is a message of group "g", keyed key.
func groupMsg(body, key string) codec.Message {
	return codec.Message{Tenant: "t", Group: "g", IdempotencyKey: key, Body: []byte(body)}
}

// splitByOwner returns destination's owner among ms, and the other members.
func splitByOwner(t *testing.T, ms []*member, destination string) (owner *member, others []*member) {
	t.Helper()
	owner, _ = ownerOf(t, ms, destination)
	for _, m := range ms {
		if m != owner {
			others = append(others, m)
		}
	}
	return owner, others
}

// Tuning.StrictGroups holds cluster-wide: a message that fails retryably,
// from a caller on one member, pauses its group for the callers of every
// member (each is answered *messages.GroupPausedError naming the failed
// message's key, and nothing of the group is sent), and the failed
// message's retry, from yet another member, resumes it. The destination
// receives the group in the order its callers saw it answered.
func TestStrictGroupPausesAndResumesAcrossMembers(t *testing.T) {
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodecs()})
	owner, others := splitByOwner(t, ms, "strict")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := others[0].node.Deliver(ctx, "strict", groupMsg("first", "k0"))
	require.NoError(t, err)
	_, err = others[0].node.Deliver(ctx, "strict", groupMsg("flaky", "k1"))
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	assert.False(t, codec.IsPermanent(err))
	for i, m := range []*member{owner, others[0], others[1]} {
		_, err := m.node.Deliver(ctx, "strict", groupMsg("held", "k2"))
		var gp *messages.GroupPausedError
		require.ErrorAs(t, err, &gp, "member %d", i)
		assert.Equal(t, messages.GroupPausedError{Group: "g", Key: "k1"}, messages.GroupPausedError{Group: gp.Group, Key: gp.Key})
	}
	// Another group is not held.
	_, err = others[1].node.Deliver(ctx, "strict", codec.Message{Tenant: "t", Group: "h", IdempotencyKey: "other", Body: []byte("other-group")})
	require.NoError(t, err)
	id, err := others[1].node.Deliver(ctx, "strict", groupMsg("flaky", "k1"))
	require.NoError(t, err, "the failed message's retry, from another member")
	assert.Equal(t, "id-flaky", id)
	_, err = owner.node.Deliver(ctx, "strict", groupMsg("after", "k3"))
	var gp *messages.GroupPausedError
	require.ErrorAs(t, err, &gp, "the group waits for the held message's retry too")
	assert.Equal(t, "k2", gp.Key)
	_, err = others[1].node.Deliver(ctx, "strict", groupMsg("held", "k2"))
	require.NoError(t, err, "the held message's retry resumes the group")
	for i, m := range []*member{owner, others[0]} {
		_, err := m.node.Deliver(ctx, "strict", groupMsg("after", "k3"))
		require.NoError(t, err, "member %d, after the resume", i)
	}
	var bodies []string
	for _, s := range owner.fake("strict").Sent() {
		if s.Group == "g" {
			bodies = append(bodies, string(s.Body))
		}
	}
	assert.Equal(t, []string{"first", "flaky", "held", "after", "after"}, bodies)
	for _, m := range others {
		assert.Empty(t, m.fake("strict").Sent(), "a non-owner's codec sent")
	}
}

// Node.ResumeGroup and PausedGroups reach the pause wherever the caller
// is: a group paused by a failure from one member's caller is listed by
// every member, resumed from a member that does not own the destination,
// and its next delivery, from any member, is then admitted although the
// failed message was never retried.
func TestResumeGroupFromAnyMember(t *testing.T) {
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodecs()})
	owner, others := splitByOwner(t, ms, "strict")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round, resumer := range []*member{others[1], owner, others[0]} {
		key := fmt.Sprint("k", round)
		_, err := others[0].node.Deliver(ctx, "strict", groupMsg("flaky", key))
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee, "round %d", round)
		for i, m := range ms {
			paused, err := m.node.PausedGroups(ctx, "strict")
			require.NoError(t, err, "round %d, member %d", round, i)
			assert.Equal(t, []string{"g"}, paused, "round %d, member %d", round, i)
		}
		_, err = others[1].node.Deliver(ctx, "strict", groupMsg("held", "h"+key))
		var gp *messages.GroupPausedError
		require.ErrorAs(t, err, &gp, "round %d", round)
		require.NoError(t, resumer.node.ResumeGroup(ctx, "strict", "g"), "round %d", round)
		for i, m := range ms {
			paused, err := m.node.PausedGroups(ctx, "strict")
			require.NoError(t, err)
			assert.Empty(t, paused, "round %d, member %d, after the resume", round, i)
		}
		id, err := others[1].node.Deliver(ctx, "strict", groupMsg("next", "n"+key))
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

// Tuning.StrictGroups across a hand-off: a paused group stays paused until
// its failed message is retried, ResumeGroup, or GroupPauseMax, as a
// batcher's restart keeps it. When the owner leaves gracefully, the groups
// its instance paused go to the members that own their destinations next
// (Node.Leave hands them over before it says it left): the group's next
// message is answered GroupPausedError naming the failed message's key,
// from every member, until that message's retry, which is sent first.
// Before, the new owner's batcher knew of no pause and sent the group's
// next message before the failed one's retry.
func TestStrictGroupPauseSurvivesALeave(t *testing.T) {
	dests := names(12)
	ms := startTestCluster(t, 3, dests, memberOpts{codec: strictCodecs()})
	// The leaver is the member that owns the most destinations.
	byOwner := map[*member][]string{}
	for _, d := range dests {
		o, _ := ownerOf(t, ms, d)
		byOwner[o] = append(byOwner[o], d)
	}
	leaver := ms[0]
	for _, m := range ms {
		if len(byOwner[m]) > len(byOwner[leaver]) {
			leaver = m
		}
	}
	owned := byOwner[leaver]
	require.NotEmpty(t, owned)
	var rest []*member
	for _, m := range ms {
		if m != leaver {
			rest = append(rest, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, d := range owned {
		_, err := rest[0].node.Deliver(ctx, d, groupMsg("flaky", "k-"+d))
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee, d)
	}
	leaver.leave(t)
	waitMembers(t, rest, 2)
	for _, d := range owned {
		for i, m := range rest {
			_, err := m.node.Deliver(ctx, d, groupMsg("held", "h-"+d))
			var gp *messages.GroupPausedError
			require.ErrorAs(t, err, &gp, "%s from member %d: the group's next message, after the leave, before the failed one's retry", d, i)
			assert.Equal(t, messages.GroupPausedError{Group: "g", Key: "k-" + d}, messages.GroupPausedError{Group: gp.Group, Key: gp.Key})
		}
		paused, err := rest[1].node.PausedGroups(ctx, d)
		require.NoError(t, err)
		assert.Equal(t, []string{"g"}, paused, d)
		_, err = rest[1].node.Deliver(ctx, d, groupMsg("flaky", "k-"+d))
		require.NoError(t, err, "%s: the failed message's retry", d)
		_, err = rest[1].node.Deliver(ctx, d, groupMsg("held", "h-"+d))
		require.NoError(t, err, "%s: the held message's retry", d)
		_, err = rest[0].node.Deliver(ctx, d, groupMsg("after", "a-"+d))
		require.NoError(t, err, d)
		var bodies []string
		for _, m := range rest {
			for _, s := range m.fake(d).Sent() {
				bodies = append(bodies, string(s.Body))
			}
		}
		assert.Equal(t, []string{"flaky", "held", "after"}, bodies, "%s: what the new owner sent", d)
	}
}

// The same across a join: a member joins and owns some destinations, whose
// groups paused on their old owners are paused on it before its grains
// admit anything (the old owner's HandoffDone carries them), until each
// failed message's retry; the old owners keep no pause of the groups they
// handed over.
func TestStrictGroupPauseSurvivesAJoin(t *testing.T) {
	dests := names(24)
	agent := test.NewInMemAgent()
	o := memberOpts{codec: strictCodecs(), noCleanup: true}
	join := func() *member {
		o := o
		o.provider = test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
		return startMember(t, dests, o)
	}
	ms := []*member{join(), join()}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, d := range dests {
		_, err := ms[0].node.Deliver(ctx, d, groupMsg("flaky", "k-"+d))
		var ee *codec.EntryError
		require.ErrorAs(t, err, &ee, d)
	}
	joiner := join()
	ms = append(ms, joiner)
	waitMembers(t, ms, 3)
	moved := 0
	for _, d := range dests {
		if o, _ := ownerOf(t, ms, d); o != joiner {
			continue
		}
		moved++
		_, err := ms[1].node.Deliver(ctx, d, groupMsg("held", "h-"+d))
		var gp *messages.GroupPausedError
		require.ErrorAs(t, err, &gp, "%s: the group's next message, after the join, before the failed one's retry", d)
		assert.Equal(t, messages.GroupPausedError{Group: "g", Key: "k-" + d}, messages.GroupPausedError{Group: gp.Group, Key: gp.Key})
		for i, m := range ms[:2] {
			paused, err := m.inst.PausedGroups(ctx, m.codecs[d])
			require.NoError(t, err)
			assert.Empty(t, paused, "%s: member %d kept the pause it handed over", d, i)
		}
		_, err = ms[0].node.Deliver(ctx, d, groupMsg("flaky", "k-"+d))
		require.NoError(t, err, "%s: the failed message's retry", d)
		_, err = ms[1].node.Deliver(ctx, d, groupMsg("held", "h-"+d))
		require.NoError(t, err, "%s: the held message's retry", d)
		_, err = ms[1].node.Deliver(ctx, d, groupMsg("after", "a-"+d))
		require.NoError(t, err, d)
		var bodies []string
		for _, s := range joiner.fake(d).Sent() {
			bodies = append(bodies, string(s.Body))
		}
		assert.Equal(t, []string{"flaky", "held", "after"}, bodies, "%s: what the new owner sent", d)
	}
	require.Positive(t, moved, "the joiner owns none of the destinations: the test proved nothing")
	t.Logf("%d of %d destinations moved to the joiner", moved, len(dests))
}

// Node.ResumeGroup when the destination's owner is silent and the member
// lists still name it: an attempt that gets no answer is made again, until
// the ctx ends, and the call then says ErrUnreachable wrapping the ctx's
// error, by its deadline; once the provider drops the member, the owner
// resolved anew answers (with nothing to resume: the pause died with its
// member).
func TestResumeGroupWhenTheOwnerIsSilent(t *testing.T) {
	ms := startTestCluster(t, 3, []string{"strict"}, memberOpts{codec: strictCodecs()})
	owner, others := splitByOwner(t, ms, "strict")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := others[0].node.Deliver(ctx, "strict", groupMsg("flaky", "k1"))
	var ee *codec.EntryError
	require.ErrorAs(t, err, &ee)
	owner.silence(t)

	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	err = others[1].node.ResumeGroup(short, "strict", "g")
	assert.ErrorIs(t, err, clustered.ErrUnreachable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "past its deadline")

	_ = owner.cluster.Config.ClusterProvider.Shutdown(false)
	require.NoError(t, others[1].node.ResumeGroup(ctx, "strict", "g"), "once the member lists drop the crashed owner")
	paused, err := others[0].node.PausedGroups(ctx, "strict")
	require.NoError(t, err)
	assert.Empty(t, paused)
	waitMembers(t, others, 2)
}
