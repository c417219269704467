package clustered

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
)

// An answer ends only a call of the role it answers: a delivery's reply
// that names a request's number, or a response that names a delivery's,
// leaves the call waiting for its own answer.
func TestAnAnswerEndsOnlyACallOfItsRole(t *testing.T) {
	cs := calls{m: map[uint32]pendingCall{}}
	req, rc := cs.beginRequest("127.0.0.1:1")
	del, dc := cs.beginDelivery("127.0.0.1:1")
	require.NotZero(t, req)
	require.NotZero(t, del)

	cs.reply(&clusterpb.DeliverReply{Call: req, Id: "stray"})
	cs.respond(del, requestAnswer{outcome: answered, activation: &cluster.ActivationResponse{}})
	assert.Empty(t, rc.answer)
	assert.Empty(t, dc.answer)
	assert.Len(t, cs.m, 2, "both still wait")

	cs.reply(&clusterpb.DeliverReply{Call: del, Id: "mine"})
	cs.respond(req, requestAnswer{outcome: answered, groups: &clusterpb.GroupsReply{Paused: []string{"g"}}})
	d := <-dc.answer
	assert.Equal(t, answered, d.outcome)
	assert.Equal(t, "mine", d.reply.Id)
	r := <-rc.answer
	assert.Equal(t, answered, r.outcome)
	assert.Equal(t, []string{"g"}, r.groups.Paused)
	assert.Empty(t, cs.m)
}

// A dead letter for a post that was taken answers notSent each delivery it
// carried that still waits; one for a post not taken yet is returned, to
// give its box up; one for a request answers it notSent.
func TestADeadLetterAnswersWhatItsPostCarried(t *testing.T) {
	cs := calls{m: map[uint32]pendingCall{}}
	first, fc := cs.beginDelivery("127.0.0.1:1")
	second, sc := cs.beginDelivery("127.0.0.1:1")
	taken := &postCall{target: "127.0.0.1:1"}
	post := cs.beginPost(taken)
	now := time.Now()
	later := now.Add(time.Minute)
	cs.carry(post, []queuedDelivery{{call: first, deadline: later}, {call: second, deadline: later}}, now)
	waited, _ := cs.end(second)
	require.True(t, waited)

	assert.Nil(t, cs.deadLetter(post))
	assert.Equal(t, deliveryAnswer{outcome: notSent}, <-fc.answer)
	assert.Empty(t, sc.answer, "its caller stopped waiting")

	untaken := &postCall{target: "127.0.0.1:1"}
	assert.Same(t, untaken, cs.deadLetter(cs.beginPost(untaken)))

	req, rc := cs.beginRequest("127.0.0.1:1")
	assert.Nil(t, cs.deadLetter(req))
	assert.Equal(t, requestAnswer{outcome: notSent}, <-rc.answer)
	assert.Empty(t, cs.m)
}
