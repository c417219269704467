package actors_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// sendDirect delivers m to inst for the Listener l, as the call numbered
// id of the process named name, with no Room: l alone says whether the
// call still waits.
func sendDirect(system *actor.ActorSystem, inst *actors.Instance, c codec.Codec, m codec.Message, l actors.Listener, name string, id uint32) {
	sender := actor.NewPID(system.Address(), name)
	sender.RequestId = id
	system.Root.Send(inst.PID(), &messages.Deliver{Codec: c, Message: m, Ref: &actors.Direct{Listener: l, Sender: sender}})
}

// panicsBeforeSend is a Listener that answers Listening true on a
// delivery's arrival and panics when the request goroutine asks again for
// the call numbered victim; it records every answer per call.
type panicsBeforeSend struct {
	victim   uint32
	mu       sync.Mutex
	asked    map[uint32]int
	answers  map[uint32][]codec.Result
	answered chan struct{}
}

func (p *panicsBeforeSend) Listening(pid *actor.PID) bool {
	p.mu.Lock()
	p.asked[pid.RequestId]++
	n := p.asked[pid.RequestId]
	p.mu.Unlock()
	if pid.RequestId == p.victim && n == 2 {
		panic("Listening panics")
	}
	return true
}

func (p *panicsBeforeSend) Answer(pid *actor.PID, r codec.Result) {
	p.mu.Lock()
	p.answers[pid.RequestId] = append(p.answers[pid.RequestId], r)
	p.mu.Unlock()
	p.answered <- struct{}{}
}

// A Listener that panics when the request goroutine asks it, just before
// its batch is sent, restarts the batcher: nothing of that batch is sent,
// and every caller, in that batch or not, is answered exactly once
// (ErrBatcherDown for what the restart held, a result for what was sent).
func TestAListeningPanicBeforeTheSendAnswersEveryCallerOnce(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "panics-before-send"})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 20 * time.Millisecond, MaxInflight: 1}
	const n = 12
	p := &panicsBeforeSend{victim: 6, asked: map[uint32]int{}, answers: map[uint32][]codec.Result{}, answered: make(chan struct{}, 2*n)}
	for i := range n {
		sendDirect(system, inst, c, msg("t", "", fmt.Sprint(i+1)), p, "panics-before-send", uint32(i+1))
	}
	for range n {
		select {
		case <-p.answered:
		case <-time.After(30 * time.Second):
			t.Fatal("not every delivery was answered")
		}
	}
	// A second answer to a call would come by the time the instance holds
	// nothing.
	require.Eventually(t, func() bool { s := inst.Stats(); return s.Queued+s.InFlight == 0 }, 10*time.Second, time.Millisecond)
	sent := map[string]bool{}
	for _, m := range c.Sent() {
		sent[string(m.Body)] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Equal(t, 2, p.asked[p.victim], "the victim was asked before its send")
	down := 0
	for i := uint32(1); i <= n; i++ {
		require.Len(t, p.answers[i], 1, "call %d answered once", i)
		r := p.answers[i][0]
		if r.Err == messages.ErrBatcherDown {
			down++
			assert.False(t, sent[fmt.Sprint(i)], "call %d was answered ErrBatcherDown but sent", i)
			continue
		}
		require.NoError(t, r.Err, "call %d", i)
		assert.True(t, sent[fmt.Sprint(i)], "call %d was answered a result but not sent", i)
	}
	assert.Positive(t, down, "the victim's batch is answered by the restart")
	assert.Equal(t, messages.ErrBatcherDown, p.answers[p.victim][0].Err)
}

// leavesBeforeSend is a Listener whose calls numbered up to last listen on
// arrival and have left when the request goroutine asks before the send;
// it records answers and Forgotten calls per call.
type leavesBeforeSend struct {
	last      uint32
	mu        sync.Mutex
	asked     map[uint32]int
	answers   map[uint32][]codec.Result
	forgotten map[uint32]int
	settled   chan struct{}
}

func (l *leavesBeforeSend) Listening(pid *actor.PID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked[pid.RequestId]++
	return pid.RequestId > l.last || l.asked[pid.RequestId] == 1
}

func (l *leavesBeforeSend) Answer(pid *actor.PID, r codec.Result) {
	l.mu.Lock()
	l.answers[pid.RequestId] = append(l.answers[pid.RequestId], r)
	l.mu.Unlock()
	l.settled <- struct{}{}
}

func (l *leavesBeforeSend) Forgotten(pid *actor.PID) {
	l.mu.Lock()
	l.forgotten[pid.RequestId]++
	l.mu.Unlock()
	l.settled <- struct{}{}
}

// A batch whose callers all left before its send makes no request: nothing
// of it reaches the codec, no flush is reported, each of its callers is
// forgotten once and never answered, and its group's next deliveries go
// out and are answered as if it had never been taken.
func TestABatchWhoseCallersAllLeftBeforeItsSendMakesNoRequest(t *testing.T) {
	rec := &recorder{}
	system, inst := start(t, actors.Config{Name: "all-left", Recorder: rec})
	c := fakecodec.New("q", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Hour, MaxInflight: 1}
	l := &leavesBeforeSend{last: 4, asked: map[uint32]int{}, answers: map[uint32][]codec.Result{}, forgotten: map[uint32]int{}, settled: make(chan struct{}, 16)}
	send := func(from, to uint32) {
		for i := from; i <= to; i++ {
			sendDirect(system, inst, c, msg("t", "g", fmt.Sprint(i)), l, "all-left", i)
		}
	}
	wait := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-l.settled:
			case <-time.After(30 * time.Second):
				t.Fatal("a call was neither answered nor forgotten")
			}
		}
	}
	send(1, 4) // a full batch: due at once
	wait(4)
	send(5, 8)
	wait(4)
	require.Eventually(t, func() bool { s := inst.Stats(); return s.Queued+s.InFlight == 0 }, 10*time.Second, time.Millisecond)

	var bodies []string
	for _, m := range c.Sent() {
		bodies = append(bodies, string(m.Body))
	}
	assert.Equal(t, []string{"5", "6", "7", "8"}, bodies, "only the callers still waiting are sent, in order")
	assert.EqualValues(t, 1, c.Requests())
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := uint32(1); i <= 8; i++ {
		if i <= 4 {
			assert.Equal(t, 1, l.forgotten[i], "call %d forgotten once", i)
			assert.Empty(t, l.answers[i], "call %d is not answered", i)
			continue
		}
		assert.Zero(t, l.forgotten[i], "call %d", i)
		require.Len(t, l.answers[i], 1, "call %d answered once", i)
		assert.NoError(t, l.answers[i][0].Err)
	}
	flushes := rec.Flushes()
	require.Len(t, flushes, 1, "the request that was not made is not reported")
	assert.Equal(t, 4, flushes[0].Entries)
}

// With WhenFull Block, a waiting actor's future that timed out (a caller
// that can say nothing) gives its turn up when room frees: a Deliver
// caller that cancels frees its room at once, and the waiter behind the
// future takes it in the same turn, while the slot is still held.
func TestAWaitingFutureThatTimedOutPassesTheFreedRoomOn(t *testing.T) {
	const within = 10 * time.Second
	system, inst := start(t, actors.Config{Name: "future-waits"})
	c, v := valved("future-waits", codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20},
		codec.Tuning{Linger: time.Millisecond, MaxInflight: 1, QueueMax: 2, WhenFull: codec.Block})
	plugged := plug(t, inst, c, v, within)
	type answer struct {
		id  string
		err error
	}
	stays := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		id, err := inst.Deliver(ctx, c, codec.Message{Tenant: "t", Body: []byte("stays")})
		stays <- answer{id, err}
	}()
	require.Eventually(t, func() bool { return inst.Stats().Queued == 1 }, within, time.Millisecond)

	qctx, cancelQ := context.WithCancel(context.Background())
	defer cancelQ()
	queued := make(chan error, 1)
	go func() {
		_, err := inst.Deliver(qctx, c, codec.Message{Tenant: "t", Body: []byte("queued")})
		queued <- err
	}()
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, within, time.Millisecond)

	future := system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "t", Body: []byte("future")}, Deadline: time.Now().Add(within)}, 200*time.Millisecond)
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 1 }, within, time.Millisecond)
	waiter := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		id, err := inst.Deliver(ctx, c, codec.Message{Tenant: "t", Body: []byte("waiter")})
		waiter <- answer{id, err}
	}()
	require.Eventually(t, func() bool { return inst.Stats().Waiting == 2 }, within, time.Millisecond)
	_, err := future.Result()
	require.ErrorIs(t, err, actor.ErrTimeout, "the future gives up")

	cancelQ()
	require.ErrorIs(t, <-queued, context.Canceled)
	if !assert.Eventually(t, func() bool { s := inst.Stats(); return s.Waiting == 0 && s.Queued == 2 }, 3*time.Second, time.Millisecond,
		"the waiter behind the future that gave up takes the freed room while the slot is held") {
		t.Logf("stats %+v", inst.Stats())
	}
	v.Open()
	require.NoError(t, <-plugged)
	for body, ch := range map[string]chan answer{"waiter": waiter, "stays": stays} {
		a := <-ch
		require.NoError(t, a.err, body)
		assert.Equal(t, "id-"+body, a.id)
	}
	for _, m := range c.Sent() {
		assert.NotEqual(t, "future", string(m.Body), "sent after its future gave up")
		assert.NotEqual(t, "queued", string(m.Body), "sent after its caller cancelled")
	}
}

// A Listener that panics when the actor asks about it outside the rules'
// lock, as a full queue is swept for room (the callers with no Room to say
// they left), restarts the batcher with nothing half done: the delivery
// that needed room and the queued ones are each answered once,
// ErrBatcherDown, and none of them is sent (the request in flight runs on).
func TestAListeningPanicWhileAFullQueueIsSweptAnswersEveryCallerOnce(t *testing.T) {
	const within = 10 * time.Second
	system, inst := start(t, actors.Config{Name: "panics-on-sweep"})
	c, v := valved("panics-on-sweep", codec.Limits{MaxEntries: 1, MaxBytes: 1 << 20},
		codec.Tuning{Linger: time.Millisecond, MaxInflight: 1, QueueMax: 2})
	plugged := plug(t, inst, c, v, within)
	p := &panicsBeforeSend{victim: 1, asked: map[uint32]int{}, answers: map[uint32][]codec.Result{}, answered: make(chan struct{}, 8)}
	send := func(i uint32) {
		sendDirect(system, inst, c, codec.Message{Tenant: "t", Body: []byte(fmt.Sprint(i))}, p, "panics-on-sweep", i)
	}
	send(1)
	send(2)
	require.Eventually(t, func() bool { return inst.Stats().Queued == 2 }, within, time.Millisecond)
	// The next delivery finds the queue full; past fullSweepEvery it asks
	// about the queued callers: call 1's Listening panics.
	require.Eventually(t, func() bool {
		send(3)
		select {
		case <-p.answered:
		case <-time.After(within):
			return false // call 3 unanswered
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.asked[1] >= 2
	}, within, 20*time.Millisecond)
	for range 2 {
		select {
		case <-p.answered:
		case <-time.After(within):
			t.Fatal("a queued call was not answered")
		}
	}
	v.Open()
	require.ErrorIs(t, <-plugged, messages.ErrBatcherDown, "the restart answers the request in flight too")
	require.Eventually(t, func() bool { s := inst.Stats(); return s.Queued+s.InFlight == 0 }, within, time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := uint32(1); i <= 2; i++ {
		require.Len(t, p.answers[i], 1, "call %d answered once", i)
		assert.Equal(t, messages.ErrBatcherDown, p.answers[i][0].Err, "call %d", i)
	}
	last := p.answers[3][len(p.answers[3])-1]
	assert.Equal(t, messages.ErrBatcherDown, last.Err, "the delivery that needed room")
	for _, m := range c.Sent() {
		assert.Equal(t, "plug", string(m.Body))
	}
}
