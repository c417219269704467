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
	"github.com/ankusa/sinkbatch/messages"
)

// bodyIDs is a member option whose fake codecs answer each message with
// its body as its id (so a caller can tell its own answer from another's),
// after latency, and count the requests of one group in flight at once.
func bodyIDs(latency time.Duration, overlaps *atomic.Int64) memberOpts {
	var mu sync.Mutex
	running := map[string]int{}
	return memberOpts{codec: func(name string) codec.Codec {
		c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 8}
		c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
			groups := map[string]bool{}
			for _, m := range batch {
				groups[name+"/"+m.Group] = true
			}
			mu.Lock()
			for g := range groups {
				if running[g] > 0 && overlaps != nil {
					overlaps.Add(1)
				}
				running[g]++
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				for g := range groups {
					running[g]--
				}
				mu.Unlock()
			}()
			if latency > 0 {
				time.Sleep(latency)
			}
			res := make([]codec.Result, len(batch))
			for i, m := range batch {
				res[i].ID = string(m.Body)
			}
			return res, nil
		}
		return c
	}}
}

// TestLeaveWithOwnDirectCallers: the owner's own callers admit
// directly while it leaves. Leave (with time to spare) must wait for
// everything admitted: it returns nil, every caller is answered with its
// own result or ErrStopped (not sent: such a message must not be at the
// destination), nothing is sent after Leave returned, and every success
// is at the destination.
func TestLeaveWithOwnDirectCallers(t *testing.T) {
	m := openedAlone(t, bodyIDs(2*time.Millisecond, nil))

	l := startDirectLoad(m, 64, 4)
	time.Sleep(300 * time.Millisecond)
	leaveCtx, cancelLeave := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLeave()
	m.gone = true
	require.NoError(t, m.node.Leave(leaveCtx))
	sentAtLeave := len(m.fake("d").Sent())
	l.wait(t, 5*time.Second, "Leave returned")
	time.Sleep(200 * time.Millisecond)
	sent := m.fake("d").Sent()
	assert.Equal(t, sentAtLeave, len(sent), "messages sent after Leave returned: it did not wait for what was admitted")
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	assert.NoError(t, m.inst.Stop(stopCtx))

	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.bad, "answers other than the caller's own result or ErrStopped")
	assert.Zero(t, l.unreachable, "answered ErrUnreachable though Leave had time to drain")
	at := map[string]int{}
	for _, s := range sent {
		at[string(s.Body)]++
	}
	for body := range l.acked {
		assert.Equal(t, 1, at[body], "acknowledged %s at the destination %d times", body, at[body])
	}
	for body := range l.stopped {
		assert.Zero(t, at[body], "%s answered ErrStopped (not sent) but it was sent", body)
	}
	t.Logf("%d acknowledged, %d stopped, %d sent", len(l.acked), len(l.stopped), len(sent))
}

// TestATopologyVersionStormAnswersEachCallerItsOwn: the owner's topology version moves on
// every few hundred microseconds (closing the door each time) while its
// own callers and the other member's deliver. Every delivery succeeds,
// with its own id, exactly once at the destination, and no group ever has
// two requests in flight.
func TestATopologyVersionStormAnswersEachCallerItsOwn(t *testing.T) {
	var overlaps atomic.Int64
	ms := startTestCluster(t, 2, []string{"d"}, bodyIDs(time.Millisecond, &overlaps))
	owner, other := ownerOf(t, ms, "d")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := other.node.Deliver(ctx, "d", codec.Message{Body: []byte("opens")})
	require.NoError(t, err)

	stop := make(chan struct{})
	var bumper sync.WaitGroup
	bumper.Add(1)
	go func() {
		defer bumper.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Microsecond):
				owner.node.NewTopologyVersion()
			}
		}
	}()
	var mu sync.Mutex
	var wrong []error
	ok := 0
	var wg sync.WaitGroup
	for i, m := range []*member{owner, owner, owner, other} {
		for c := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := range 40 {
					body := fmt.Sprintf("m%d.c%d/%d", i, c, seq)
					id, err := m.node.Deliver(ctx, "d", codec.Message{Group: fmt.Sprintf("g%d", c%3), Body: []byte(body)})
					mu.Lock()
					if err != nil || id != body {
						wrong = append(wrong, fmt.Errorf("%s: id %q, %v", body, id, err))
					} else {
						ok++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	bumper.Wait()
	assert.Empty(t, wrong)
	at := map[string]int{}
	for _, s := range owner.fake("d").Sent() {
		at[string(s.Body)]++
	}
	for _, s := range other.fake("d").Sent() {
		at[string(s.Body)]++
	}
	dup := 0
	for _, n := range at {
		if n > 1 {
			dup++
		}
	}
	assert.Zero(t, dup, "messages sent more than once")
	assert.Zero(t, overlaps.Load(), "requests of one group in flight at once")
	t.Logf("%d ok, %d sent by the owner, %d by the other", ok, len(owner.fake("d").Sent()), len(other.fake("d").Sent()))
}

// TestLeaveGivesUpUnderDirectLoad: Leave's ctx ends while the
// owner's own callers keep admitting directly (and keep arriving, some
// between their ledger count and their call). Every caller is answered at
// once: ErrUnreachable (may have been sent) or ErrStopped (not sent, and
// then not at the destination), or its own result.
func TestLeaveGivesUpUnderDirectLoad(t *testing.T) {
	m := openedAlone(t, bodyIDs(400*time.Millisecond, nil))

	l := startDirectLoad(m, 64, 64)
	time.Sleep(150 * time.Millisecond)
	leaveCtx, cancelLeave := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelLeave()
	m.gone = true
	leaveAt := time.Now()
	sentBefore := len(m.fake("d").Sent())
	leaveErr := m.node.Leave(leaveCtx)
	t.Logf("Leave took %v, returned %v; sent %d before, %d after", time.Since(leaveAt), leaveErr, sentBefore, len(m.fake("d").Sent()))
	assert.ErrorIs(t, leaveErr, context.DeadlineExceeded)
	l.wait(t, 3*time.Second, "Leave gave up")
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	_ = m.inst.Stop(stopCtx)
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.bad)
	for _, s := range m.fake("d").Sent() {
		assert.False(t, l.stopped[string(s.Body)], "%s answered ErrStopped (not sent) but sent", s.Body)
	}
	t.Logf("%d stopped, %d unreachable, %d sent", len(l.stopped), l.unreachable, len(m.fake("d").Sent()))
}

// directLoad is a member's own callers delivering to "d", each until it
// is answered with anything but its own id, and what they were answered.
type directLoad struct {
	wg             sync.WaitGroup
	mu             sync.Mutex
	acked, stopped map[string]bool
	unreachable    int
	bad            []error
}

// startDirectLoad starts callers callers on m, over groups groups.
func startDirectLoad(m *member, callers, groups int) *directLoad {
	l := &directLoad{acked: map[string]bool{}, stopped: map[string]bool{}}
	for c := range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for seq := 0; ; seq++ {
				body := fmt.Sprintf("c%d/%d", c, seq)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				id, err := m.node.Deliver(ctx, "d", codec.Message{Group: fmt.Sprintf("g%d", c%groups), Body: []byte(body)})
				cancel()
				if !l.record(body, id, err) {
					return
				}
			}
		}()
	}
	return l
}

// record takes the answer to body; it reports whether it was the caller's
// own id.
func (l *directLoad) record(body, id string, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil && id == body:
		l.acked[body] = true
		return true
	case err == nil:
		l.bad = append(l.bad, fmt.Errorf("%s answered with another's id %q", body, id))
	case errors.Is(err, messages.ErrStopped):
		l.stopped[body] = true
	case errors.Is(err, clustered.ErrUnreachable):
		l.unreachable++
	default:
		l.bad = append(l.bad, fmt.Errorf("%s: %w", body, err))
	}
	return false
}

// wait fails t unless every caller is answered within d of after.
func (l *directLoad) wait(t *testing.T, d time.Duration, after string) {
	t.Helper()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("callers still waiting %v after %s", d, after)
	}
}
