//go:build !race

package clustered_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// TestOwnersCallersAdmitDirectly: once the owner's grain admits, the
// owner's own callers hand their deliveries to its instance directly (one
// call each, no batch message to the grain), and are answered with their
// own results; a newer topology closes that until the grain, reached the
// long way, finds its member still owns the destination; Leave closes it
// for good.
func TestOwnersCallersAdmitDirectly(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"d"}, memberOpts{})
	owner, other := ownerOf(t, ms, "d")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := func(s string) codec.Message { return codec.Message{Body: []byte(s)} }

	assert.False(t, owner.node.OpenHere("d"), "no grain yet")
	_, err := other.node.Deliver(ctx, "d", msg("activates the grain"))
	require.NoError(t, err)
	require.True(t, owner.node.OpenHere("d"), "the admitting grain opens the destination to its member's callers")

	const n = 50
	before, beforeDirect := owner.node.Calls(), owner.node.DirectCalls()
	ids := map[string]bool{}
	for i := range n {
		id, err := owner.node.Deliver(ctx, "d", msg("direct"))
		require.NoError(t, err, "delivery %d", i)
		ids[id] = true
	}
	assert.Equal(t, uint64(n), owner.node.DirectCalls()-beforeDirect, "one direct call per delivery")
	assert.Equal(t, before, owner.node.Calls(), "none went through the grain")
	assert.Len(t, ids, n, "each caller gets its own message's id")
	assert.Len(t, owner.fake("d").Sent(), n+1, "all sent by the owner's batcher")

	owner.node.NewTopologyVersion()
	assert.False(t, owner.node.OpenHere("d"), "opened in an older topology")
	before, beforeDirect = owner.node.Calls(), owner.node.DirectCalls()
	_, err = owner.node.Deliver(ctx, "d", msg("the long way"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, owner.node.Calls()-before, uint32(2), "through the grain: a call and a batch message")
	assert.Equal(t, beforeDirect, owner.node.DirectCalls(), "not admitted directly")
	assert.True(t, owner.node.OpenHere("d"), "the grain, still the owner's, opens it again")

	owner.leave(t)
	assert.False(t, owner.node.OpenHere("d"), "Leave closes it")
}

// TestLeaveGivingUpAnswersDirectCallers: the owner's callers whose
// deliveries it admitted directly, held by a destination that does not
// answer, are answered at once when Leave's ctx ends (ErrUnreachable: the
// messages may have been sent), not when the destination answers or at
// their deadlines.
func TestLeaveGivingUpAnswersDirectCallers(t *testing.T) {
	const n = 20
	m, answers, free := heldDirectly(t, n)

	leaveCtx, cancelLeave := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelLeave()
	left := make(chan error, 1)
	go func() { left <- m.node.Leave(leaveCtx) }()
	m.gone = true
	// By Leave itself, not by the cluster's shutdown after it (which drops
	// this member: see TestCutOffOfItsOwnMemberAnswersDirectCallers).
	answeredUnreachable(t, answers, n, "the node left before its owner answered", "Leave giving up")
	assert.ErrorIs(t, <-left, context.DeadlineExceeded)
	free()
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	assert.NoError(t, m.inst.Stop(stopCtx))
}

// heldDirectly starts a one-member cluster whose destination "d" holds
// every message until free is called, and n deliveries its own callers
// admitted directly; each caller's error arrives on answers.
func heldDirectly(t *testing.T, n int) (m *member, answers chan error, free func()) {
	t.Helper()
	release := make(chan struct{})
	var hooked atomic.Int64 // held messages the destination has received
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	o := memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			if string(batch[0].Body) == "hold" {
				hooked.Add(int64(len(batch)))
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return make([]codec.Result, len(batch)), nil
		}
		return c
	}}
	m = openedAlone(t, o)
	t.Cleanup(free)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)

	before := m.node.DirectCalls()
	answers = make(chan error, n)
	for range n {
		go func() {
			_, err := m.node.Deliver(ctx, "d", codec.Message{Body: []byte("hold")})
			answers <- err
		}()
	}
	require.Eventually(t, func() bool { return hooked.Load()+int64(m.inst.Stats().Queued) == int64(n) }, 10*time.Second, time.Millisecond,
		"every held message is admitted")
	require.Equal(t, uint64(n), m.node.DirectCalls()-before, "admitted directly: one call each")
	return m, answers, free
}

// TestCutOffOfItsOwnMemberAnswersDirectCallers: when the member lists drop
// the member itself, its callers whose deliveries it admitted directly are
// answered at once, ErrUnreachable (the messages may have been sent), as a
// caller waiting on any other member that left is.
func TestCutOffOfItsOwnMemberAnswersDirectCallers(t *testing.T) {
	const n = 10
	m, answers, free := heldDirectly(t, n)
	m.node.CutOff(m.system.Address())
	answeredUnreachable(t, answers, n, "its member left the cluster", "the cut-off")
	free()
}

// answeredUnreachable takes n callers' errors from answers, each
// ErrUnreachable saying why, within 5 s of the event that should answer
// them.
func answeredUnreachable(t *testing.T, answers <-chan error, n int, why, event string) {
	t.Helper()
	giveUp := time.After(5 * time.Second)
	for i := range n {
		select {
		case err := <-answers:
			assert.ErrorIs(t, err, clustered.ErrUnreachable, "answer %d", i)
			assert.ErrorContains(t, err, why, "answer %d", i)
		case <-giveUp:
			t.Fatalf("only %d of %d callers were answered within 5 s of %s", i, n, event)
		}
	}
}

// openedAlone starts a cluster of one member with o, and delivers to "d"
// once: its grain then admits, and opens "d" to the member's own callers.
func openedAlone(t *testing.T, o memberOpts) *member {
	t.Helper()
	m := startTestCluster(t, 1, []string{"d"}, o)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := m.node.Deliver(ctx, "d", codec.Message{Body: []byte("opens")})
	require.NoError(t, err)
	require.True(t, m.node.OpenHere("d"))
	return m
}

// TestCallersGetTheirOwnAnswerWhileOthersGiveUp attacks the reuse of a
// delivery's call record: callers whose deadlines pass while their
// deliveries wait or are sent put their records back, and others take them
// at once, while the batcher still answers the first (late, or with a
// deadline error). Every answer must reach only the caller it was meant
// for: the destination answers each message with its own body as its id,
// so a caller given another's answer sees an id that is not its own. The
// callers are on the owner (direct deliveries, whose records answer by
// token) or on the other member (through the wire, answered by call
// number).
func TestCallersGetTheirOwnAnswerWhileOthersGiveUp(t *testing.T) {
	for _, where := range []string{"owner", "other"} {
		t.Run(where, func(t *testing.T) { callersGetTheirOwnAnswer(t, where) })
	}
}

func callersGetTheirOwnAnswer(t *testing.T, where string) {
	ms := startTestCluster(t, 2, []string{"d"}, bodyIDs(time.Millisecond, nil))
	owner, m := ownerOf(t, ms, "d")
	if where == "owner" {
		m = owner
	}
	opened, cancelOpen := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelOpen()
	_, err := owner.node.Deliver(opened, "d", codec.Message{Body: []byte("opens")})
	require.NoError(t, err)
	require.True(t, owner.node.OpenHere("d"))
	before := m.node.DirectCalls()

	const callers, each = 100, 60
	var ok, gaveUp atomic.Int64
	var wrong atomic.Value
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("c%d-%d", c, i)
				// Deadlines from 0.2 to 4 ms: about half pass first.
				timeout := time.Duration(200+(c*37+i*53)%3800) * time.Microsecond
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				id, err := m.node.Deliver(ctx, "d", codec.Message{Body: []byte(body)})
				cancel()
				switch {
				case err == nil && id == body:
					ok.Add(1)
				case err == nil:
					wrong.Store(fmt.Sprintf("caller of %q was answered with id %q", body, id))
				case errors.Is(err, clustered.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				default:
					wrong.Store(fmt.Sprintf("caller of %q: unexpected error %v", body, err))
				}
			}
		}()
	}
	wg.Wait()
	if w, _ := wrong.Load().(string); w != "" {
		t.Fatal(w)
	}
	t.Logf("%d answered with their own id, %d gave up", ok.Load(), gaveUp.Load())
	require.Equal(t, int64(callers*each), ok.Load()+gaveUp.Load())
	require.Positive(t, ok.Load(), "some deliveries succeed")
	require.Greater(t, gaveUp.Load(), int64(callers*each/10), "many callers give up while their deliveries are held")
	if where == "owner" {
		require.GreaterOrEqual(t, m.node.DirectCalls()-before, uint64(ok.Load()), "admitted directly")
	} else {
		require.Equal(t, before, m.node.DirectCalls(), "through the wire")
	}
}
