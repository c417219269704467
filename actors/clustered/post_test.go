package clustered

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// These tests drive the batching of deliveries on one member, with a
// stand-in grain on the same member: no cluster, so they run under -race.

// scriptedGrain stands in for a destination's grain: it holds the first
// batch until released, records every batch, and answers each delivery
// NotOwner if its body is "not-owner", else with its body as the id.
type scriptedGrain struct {
	n       *Node
	release chan struct{}
	mu      sync.Mutex
	batches [][]*clusterpb.DeliverRequest
}

func (g *scriptedGrain) Receive(ctx actor.Context) {
	o, ok := ctx.Message().(*outgoing)
	if !ok {
		return
	}
	g.mu.Lock()
	first := len(g.batches) == 0
	g.mu.Unlock()
	if first {
		<-g.release
	}
	b := o.take()
	g.mu.Lock()
	g.batches = append(g.batches, b.Requests)
	g.mu.Unlock()
	for _, r := range b.Requests {
		reply := &clusterpb.DeliverReply{Call: r.Call, Id: string(r.Body)}
		if string(r.Body) == "not-owner" {
			reply = &clusterpb.DeliverReply{Call: r.Call, NotOwner: true}
		}
		g.n.reply(ctx.Sender(), reply)
	}
}

func (g *scriptedGrain) taken() [][]*clusterpb.DeliverRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]*clusterpb.DeliverRequest(nil), g.batches...)
}

// localNode is a node on a member without a cluster, and a scripted grain
// on it.
func localNode(t *testing.T) (*Node, *actor.PID, *scriptedGrain) {
	t.Helper()
	system, inst := testinst.Start(t, actors.Config{})
	n, err := New(system, Config{Instance: inst, Destinations: Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}})
	require.NoError(t, err)
	g := &scriptedGrain{n: n, release: make(chan struct{})}
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return g }))
	t.Cleanup(func() {
		require.NoError(t, system.Root.StopFuture(pid).Wait())
		require.NoError(t, n.Leave(context.Background()))
	})
	return n, pid, g
}

// queued counts the deliveries waiting in n's outboxes.
func queued(obs *outboxes) int {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	total := 0
	for _, ob := range obs.m {
		total += len(ob.pending)
	}
	return total
}

// calls are the call numbers of the deliveries waiting in n's outboxes, in
// their order.
func queuedCalls(obs *outboxes) []uint32 {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	var out []uint32
	for _, ob := range obs.m {
		for _, q := range ob.pending {
			out = append(out, q.call)
		}
	}
	return out
}

func delivery(body string) queuedDelivery {
	return queuedDelivery{deadline: time.Now().Add(10 * time.Second), message: codec.Message{Body: []byte(body)}}
}

// TestConcurrentDeliveriesShareABatchAndKeepTheirAnswers: a delivery made
// when nothing is on its way is sent at once; those made while its batch
// message waits go together in the next one, in the order they were
// queued; each caller gets the answer to its own delivery, NotOwner
// included.
func TestConcurrentDeliveriesShareABatchAndKeepTheirAnswers(t *testing.T) {
	n, grain, g := localNode(t)
	ctx := context.Background()
	const callers = 20
	answers := make([]deliveryAnswer, callers+1)
	var wg sync.WaitGroup
	send := func(i int) {
		defer wg.Done()
		body := fmt.Sprint(i)
		if i%5 == 0 {
			body = "not-owner"
		}
		a, err := n.send(ctx, time.Now().Add(time.Minute), grain, "d", delivery(body))
		assert.NoError(t, err)
		answers[i] = a
	}
	// The first delivery posts a batch message, which the grain holds; the
	// others queue behind it.
	wg.Add(1)
	go send(0)
	require.Eventually(t, func() bool { return queued(&n.outboxes) == 1 }, 10*time.Second, time.Millisecond)
	for i := 1; i <= callers; i++ {
		wg.Add(1)
		go send(i)
	}
	require.Eventually(t, func() bool { return queued(&n.outboxes) == callers+1 }, 10*time.Second, time.Millisecond)
	queuedOrder := queuedCalls(&n.outboxes)
	close(g.release)
	wg.Wait()

	batches := g.taken()
	require.Len(t, batches, 1, "every delivery queued before the first batch was taken goes in it")
	var sent []uint32
	for _, r := range batches[0] {
		sent = append(sent, r.Call)
	}
	assert.Equal(t, queuedOrder, sent, "a batch keeps the order deliveries were queued in")
	for i := 0; i <= callers; i++ {
		require.Equal(t, answered, answers[i].outcome, "%d", i)
		r := answers[i].reply
		if i%5 == 0 {
			assert.True(t, r.NotOwner, "%d", i)
		} else {
			assert.False(t, r.NotOwner, "%d", i)
			assert.Equal(t, fmt.Sprint(i), r.Id, "a caller gets its own delivery's answer")
		}
	}

	// Light load: one delivery, nothing on its way, is sent at once.
	a, err := n.send(ctx, time.Now().Add(time.Minute), grain, "d", delivery("alone"))
	require.NoError(t, err)
	assert.Equal(t, "alone", a.reply.Id)
	assert.Len(t, g.taken(), 2)
	assert.Empty(t, n.outboxes.m, "an outbox goes once its batch is taken")
	assert.Empty(t, n.calls.m, "no call outlives its answer")
}

// TestAbandonedDeliveryIsNotSent: a delivery whose caller stops waiting
// while it is queued stays out of the batch.
func TestAbandonedDeliveryIsNotSent(t *testing.T) {
	n, grain, g := localNode(t)
	first := make(chan deliveryAnswer)
	go func() {
		a, _ := n.send(context.Background(), time.Now().Add(time.Minute), grain, "d", delivery("first"))
		first <- a
	}()
	require.Eventually(t, func() bool { return queued(&n.outboxes) == 1 }, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error)
	go func() {
		_, err := n.send(ctx, time.Now().Add(time.Minute), grain, "d", delivery("abandoned"))
		gaveUp <- err
	}()
	require.Eventually(t, func() bool { return queued(&n.outboxes) == 2 }, 10*time.Second, time.Millisecond)
	cancel()
	err := <-gaveUp
	assert.ErrorIs(t, err, ErrUnreachable)
	assert.ErrorIs(t, err, context.Canceled)
	close(g.release)
	assert.Equal(t, "first", (<-first).reply.Id)
	batches := g.taken()
	require.Len(t, batches, 1)
	require.Len(t, batches[0], 1, "only the delivery still awaited is sent")
	assert.Equal(t, "first", string(batches[0][0].Body))
	assert.Empty(t, n.calls.m)
}

// TestBatchThatDeadLettersIsRetried: deliveries queued for a grain that is
// gone come back as never sent, each one (the caller then looks for the
// owner again).
func TestBatchThatDeadLettersIsRetried(t *testing.T) {
	n, _, _ := localNode(t)
	gone := actor.NewPID(n.system.Address(), "no-such-grain")
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := n.send(context.Background(), time.Now().Add(time.Minute), gone, "d", delivery(fmt.Sprint(i)))
			assert.NoError(t, err)
			assert.Equal(t, notSent, a.outcome, "%d: a dead letter is not sent", i)
		}()
	}
	wg.Wait()
	assert.Empty(t, n.outboxes.m)
	assert.Empty(t, n.calls.m)
}

// TestCutOffAnswersQueuedAsNotSent: when a member is cut off, what waits in
// an outbox for it is answered as never sent (retried), not as
// ErrUnreachable.
func TestCutOffAnswersQueuedAsNotSent(t *testing.T) {
	n, grain, g := localNode(t)
	answers := make(chan deliveryAnswer, 3)
	for _, body := range []string{"a", "b", "c"} {
		go func() {
			a, _ := n.send(context.Background(), time.Now().Add(time.Minute), grain, "d", delivery(body))
			answers <- a
		}()
	}
	require.Eventually(t, func() bool { return queued(&n.outboxes) == 3 }, 10*time.Second, time.Millisecond)
	n.cutOff(n.system.Address())
	for range 3 {
		assert.Equal(t, notSent, (<-answers).outcome)
	}
	close(g.release)
	assert.Empty(t, n.calls.m)
}

// TestDeliverWithNilContext: a nil ctx is refused with actors.ErrNilContext
// (permanent), as Instance.Deliver refuses it.
func TestDeliverWithNilContext(t *testing.T) {
	n, _, g := localNode(t)
	close(g.release)
	var none context.Context
	_, err := n.Deliver(none, "d", codec.Message{Body: []byte("x")})
	assert.ErrorIs(t, err, actors.ErrNilContext)
	assert.True(t, codec.IsPermanent(err))
}

// TestCutOffAfterAGracefulLeaveAnswersNotSent: a call sent to a member
// that then said it left gracefully (a HandoffDone naming no destination,
// at the node's endpoint) is answered as never admitted when the member is
// cut off, and tried again; without that word it is answered memberLeft
// (ErrUnreachable). The word is used once: the member lists dropping the
// member forget it.
func TestCutOffAfterAGracefulLeaveAnswersNotSent(t *testing.T) {
	n, _, g := localNode(t)
	close(g.release)
	const graceful, crashed = "127.0.0.1:1", "127.0.0.1:2"
	wait := func(address string) <-chan outcome {
		out := make(chan outcome, 1)
		id, c := n.calls.beginRequest(address)
		go func() {
			a, err := n.awaitRequest(context.Background(), time.Now().Add(time.Minute), id, c)
			assert.NoError(t, err)
			out <- a.outcome
		}()
		return out
	}
	a, b := wait(graceful), wait(crashed)
	require.Eventually(t, func() bool {
		n.calls.mu.Lock()
		defer n.calls.mu.Unlock()
		return len(n.calls.m) == 2
	}, 10*time.Second, time.Millisecond)
	n.system.Root.Send(n.PID(), &clusterpb.HandoffDone{Member: graceful})
	n.onTopology(&cluster.ClusterTopology{Left: []*cluster.Member{
		{Host: "127.0.0.1", Port: 1}, {Host: "127.0.0.1", Port: 2},
	}})
	assert.Equal(t, notSent, <-a, "a call to a member that left gracefully")
	assert.Equal(t, memberLeft, <-b, "a call to a member that did not say so")

	c := wait(graceful)
	require.Eventually(t, func() bool {
		n.calls.mu.Lock()
		defer n.calls.mu.Unlock()
		return len(n.calls.m) == 1
	}, 10*time.Second, time.Millisecond)
	n.cutOff(graceful)
	assert.Equal(t, memberLeft, <-c, "the word was used when the member lists dropped it")
}

// TestLeaveGivingUpAnswersEveryCall: when Leave's ctx ends before what is in
// flight is answered, a caller still waiting is answered at once: a
// delivery still queued with ErrStopped (it is never sent), one already
// written with ErrUnreachable (it may have been sent); and a call begun
// after that, by a caller already past its checks, is answered at once too,
// with nothing queued or sent. Callers wait on their own channels only, so
// this is the only word they get.
func TestLeaveGivingUpAnswersEveryCall(t *testing.T) {
	system, inst := testinst.Start(t, actors.Config{})
	n, err := New(system, Config{Instance: inst, Destinations: Destinations{"d": fakecodec.New("d", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})}})
	require.NoError(t, err)
	g := &scriptedGrain{n: n, release: make(chan struct{})}
	grain := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return g }))
	t.Cleanup(func() {
		close(g.release)
		require.NoError(t, system.Root.StopFuture(grain).Wait())
	})
	n.cache.put("d", grain)

	waiting := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := n.DeliverResult(ctx, "d", codec.Message{Body: []byte("held")})
		waiting <- err
	}()
	// The grain holds its batch message before taking it: the delivery
	// stays queued, and its caller waits.
	require.Eventually(t, func() bool { return queued(&n.outboxes) == 1 }, 10*time.Second, time.Millisecond)
	// A delivery as a batch already took it: written, waiting.
	written, wc := n.calls.beginDelivery("elsewhere")
	n.calls.carry(0, []queuedDelivery{{call: written, deadline: time.Now().Add(time.Minute)}}, time.Now())

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, n.Leave(ctx), context.DeadlineExceeded)
	select {
	case err := <-waiting:
		assert.ErrorIs(t, err, messages.ErrStopped)
		assert.ErrorContains(t, err, "it was not sent")
	case <-time.After(10 * time.Second):
		t.Fatal("a caller waiting when Leave gave up was not answered")
	}
	select {
	case a := <-wc.answer:
		assert.Equal(t, nodeQuit, a.outcome, "a written delivery is answered as maybe sent")
	case <-time.After(10 * time.Second):
		t.Fatal("a written delivery waiting when Leave gave up was not answered")
	}

	a, err := n.send(context.Background(), time.Now().Add(time.Minute), grain, "d", delivery("late"))
	require.NoError(t, err)
	assert.Equal(t, quitUnsent, a.outcome, "a call begun after Leave gave up is answered at once")
	assert.Zero(t, queued(&n.outboxes), "and nothing is queued for it")
	assert.Empty(t, n.calls.m)
	_, err = n.DeliverResult(context.Background(), "d", codec.Message{Body: []byte("after")})
	assert.ErrorIs(t, err, messages.ErrStopped)
}

// lyingCtx reports a deadline its Done never keeps.
type lyingCtx struct{ context.Context }

func (lyingCtx) Deadline() (time.Time, bool) { return time.Now().Add(time.Millisecond), true }

type ctxKey struct{}

// TestKeepsDeadlineTrustsOnlyTheStandardTimerCtx: a wait goes without a
// timer of its own only for a ctx whose Done the standard library closes at
// the deadline the wait keeps.
func TestKeepsDeadlineTrustsOnlyTheStandardTimerCtx(t *testing.T) {
	deadline := time.Now().Add(time.Minute)
	timed, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	assert.True(t, keepsDeadline(timed, deadline))
	assert.True(t, keepsDeadline(timed, deadline.Add(time.Second)), "a sooner deadline is kept too")
	assert.False(t, keepsDeadline(timed, deadline.Add(-time.Second)), "a later one is not")

	wrapped, cancelWrapped := context.WithCancel(timed)
	defer cancelWrapped()
	assert.False(t, keepsDeadline(wrapped, deadline), "a ctx wrapping another is not trusted")
	assert.False(t, keepsDeadline(context.WithValue(timed, ctxKey{}, 1), deadline))
	assert.False(t, keepsDeadline(lyingCtx{context.Background()}, deadline))
	assert.False(t, keepsDeadline(context.Background(), deadline))
	// WithDeadline under a parent with a sooner deadline is a cancel ctx.
	later, cancelLater := context.WithDeadline(timed, deadline.Add(time.Hour))
	defer cancelLater()
	assert.False(t, keepsDeadline(later, deadline))
}
