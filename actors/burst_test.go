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

// A burst the batcher finds waiting in its mailbox is queued without a
// look at the batch after each delivery, but the last one looks: the
// linger timer is armed although no message follows the burst, so the
// burst leaves after Linger.
func TestBurstInMailboxLeavesAfterLinger(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "burst"})
	const n = 200 // several times the deliveries handled in a row without a look
	c := fakecodec.New("burst", codec.Limits{MaxEntries: 1000, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: 50 * time.Millisecond}
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	c.SizeHook = func(m codec.Message) int {
		first.Do(func() { close(entered); <-release })
		return len(m.Body)
	}
	send := func() *actor.Future {
		return system.Root.RequestFuture(inst.PID(), &messages.Deliver{Codec: c, Message: codec.Message{Tenant: "t", Body: []byte("x")}}, 10*time.Second)
	}
	futures := []*actor.Future{send()}
	<-entered // the batcher is in Size: what is sent now waits in its mailbox
	for range n - 1 {
		futures = append(futures, send())
	}
	close(release)
	for _, f := range futures {
		res, err := f.Result()
		require.NoError(t, err)
		require.NoError(t, res.(*messages.Delivered).Err)
	}
	// One request unless Linger ran out while the burst was handled (a
	// loaded machine): then that delivery's look sent what was queued.
	sent := 0
	for _, k := range c.BatchSizes() {
		sent += k
	}
	assert.Equal(t, n, sent)
}

// seen counts the bodies a codec's requests carried, copied as SendBatch
// sees them, and notes any body that changed while its request ran.
type seen struct {
	mu      sync.Mutex
	bodies  map[string]int
	changed []string
}

// hook answers each message with an id made of its body (see echoIDs) and
// counts the body. It checks the batch again after yielding once to other
// goroutines: a batch slice handed to another request before this one
// returned would show other bodies.
func (s *seen) hook(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	before := make([]string, len(batch))
	for i, m := range batch {
		before[i] = string(m.Body)
	}
	res, _ := echoIDs(ctx, batch)
	// The wait a request's round trip is, during which other requests of
	// the destination end and start.
	t := time.NewTimer(time.Millisecond)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range batch {
		if string(m.Body) != before[i] {
			s.changed = append(s.changed, before[i]+" became "+string(m.Body))
		}
		s.bodies[before[i]]++
	}
	return res, nil
}

// A burst that fills the mailboxes of many batchers with Linger set (each
// batcher held in its first Size until every caller has started its call)
// is queued
// with advance left to the last delivery of each run: every batch must
// still leave once its Linger has run out, with nothing left queued, every
// caller answered with its own message's id, and each body sent once.
func TestBurstsToManyDestinationsLeaveAfterLinger(t *testing.T) {
	const linger = 30 * time.Millisecond
	// Deliveries per destination: runs shorter and longer than
	// maxDeferred (32), so that some batchers see the whole burst within
	// one run and others need an advance in the middle of it.
	perDest := []int{1, 2, 5, 17, 31, 32, 33, 40, 64, 65, 100, 150}
	dests, total := len(perDest), 0
	for _, n := range perDest {
		total += n
	}
	_, inst := start(t, actors.Config{Name: "burst"})
	s := &seen{bodies: map[string]int{}}
	release := make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open)
	codecs := make([]*fakecodec.Codec, dests)
	for i := range codecs {
		c := fakecodec.New(fmt.Sprintf("dest%d", i), codec.Limits{MaxEntries: 1000, MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: linger}
		c.Hook = s.hook
		c.Discard = true
		var first sync.Once
		c.SizeHook = func(m codec.Message) int {
			first.Do(func() { <-release })
			return len(m.Body)
		}
		codecs[i] = c
	}

	var (
		wg       sync.WaitGroup
		sent     sync.WaitGroup
		released time.Time
		mu       sync.Mutex
		late     []string
	)
	sent.Add(total)
	for d, n := range perDest {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf("d%d-%d", d, i)
				sent.Done()
				id, err := inst.Deliver(context.Background(), codecs[d], codec.Message{Tenant: fmt.Sprint("t", i%3), Body: []byte(body)})
				ended := time.Now()
				if assert.NoError(t, err) {
					assert.Equal(t, "id-"+body, id, "an answer carries its own message's result")
				}
				mu.Lock()
				defer mu.Unlock()
				if !released.IsZero() {
					if waited := ended.Sub(released); waited > linger+hangSlack {
						late = append(late, fmt.Sprintf("%s answered %v after the release", body, waited))
					}
				}
			}()
		}
	}
	sent.Wait()
	mu.Lock()
	released = time.Now()
	mu.Unlock()
	open()
	wg.Wait()
	assert.Empty(t, late, "a batch stayed queued past its Linger")
	require.Eventually(t, func() bool { return inst.Stats().Queued == 0 }, hangSlack, time.Millisecond)

	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Empty(t, s.changed, "a batch changed while its request ran")
	assert.Len(t, s.bodies, total)
	for b, n := range s.bodies {
		assert.Equal(t, 1, n, "body %s sent %d times", b, n)
	}
}
