package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

// verdict is what the unruly codec last answered for a body.
type verdict int

const (
	vNone    verdict = iota // never answered
	vOK                     // accepted, with id "id-"+body
	vEntry                  // its own entry error, code "E-"+body
	vCount                  // the request's results were one short or one too many
	vPanic                  // SendBatch panicked
	vRefused                // refused alone: the bisection's last word
	vCtx                    // the request's ctx ended
	vVerdicts
)

// unruly is a codec's SendBatch that, on the request goroutines sharing one
// destination's pooled buffers, refuses any request of more than one
// message holding a "bad" body (so that the batcher bisects), and answers
// each other request at random: all accepted, an entry error for some, one
// result too few or too many, or a panic, after a short round trip. It
// notes for every body the last thing it answered for it, under one lock:
// a body's requests are sent one after another, so the last note is the
// answer its caller must get, unless the call ended first, or its message
// was in a half of a bisection that an earlier half's failure (a panic, a
// wrong count) ended: it is never sent, and gets that failure.
type unruly struct {
	mu       sync.Mutex
	last     map[string]verdict
	accepted map[string]int // times each body was accepted
	seen     [vVerdicts]int
	moved    []string // a body whose batch slot changed while the codec held it
}

func (u *unruly) note(batch []codec.Message, v verdict) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, m := range batch {
		u.last[string(m.Body)] = v
	}
	u.seen[v]++
}

func (u *unruly) hook(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	before := make([]string, len(batch))
	bad := false
	for i, m := range batch {
		before[i] = string(m.Body)
		bad = bad || strings.HasPrefix(before[i], "bad")
	}
	t := time.NewTimer(time.Duration(rand.IntN(300)) * time.Microsecond)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		u.note(batch, vCtx)
		return nil, ctx.Err()
	}
	for i, m := range batch {
		if string(m.Body) != before[i] {
			u.mu.Lock()
			u.moved = append(u.moved, before[i]+" became "+string(m.Body))
			u.mu.Unlock()
		}
	}
	if bad {
		if len(batch) > 1 {
			return nil, fmt.Errorf("unruly: %w", codec.ErrRefused)
		}
		u.note(batch, vRefused)
		return nil, fmt.Errorf("unruly: alone: %w", codec.ErrRefused)
	}
	switch rand.IntN(8) {
	case 0:
		u.note(batch, vPanic)
		panic("unruly: SendBatch panics")
	case 1:
		u.note(batch, vCount)
		n := len(batch) + 1
		if rand.IntN(2) == 0 {
			n = len(batch) - 1
		}
		return make([]codec.Result, n), nil
	}
	res := make([]codec.Result, len(batch))
	u.mu.Lock()
	defer u.mu.Unlock()
	u.seen[vOK]++
	for i, b := range before {
		if rand.IntN(4) == 0 {
			res[i].Err = &codec.EntryError{Code: "E-" + b}
			u.last[b] = vEntry
			continue
		}
		res[i].ID = "id-" + b
		u.last[b] = vOK
		u.accepted[b]++
	}
	return res, nil
}

// The batcher's pooled message and result buffers (Params.bufs), passed
// from one request goroutine of a destination to the next while other
// requests of it bisect, get too many or too few results, panic and are
// cancelled by Stop's ctx ending mid-request: every caller's answer is the
// codec's last word on its own message (its own id, its own entry error,
// the failure of its own request), or ErrStopped, or its deadline; never
// another message's id or entry error, and no batch changes while the codec
// holds it; each accepted body is accepted once, and an entry error is
// retryable. Calls are made back to back on pooled reply processes, so an
// answer left over from an earlier call would show as a wrong id. It runs
// with Stop midway, and without Stop on more request slots with one
// destination taking a message a request.
func TestPooledBuffersCarryEachCallersOwnAnswer(t *testing.T) {
	t.Run("stop midway", func(t *testing.T) {
		pooledBuffers(t, 4, func(i int) int { return 2 + 4*i }, true)
	})
	t.Run("no stop", func(t *testing.T) {
		pooledBuffers(t, 8, func(i int) int { return 1 + 3*i }, false)
	})
}

func pooledBuffers(t *testing.T, sinkConcurrency int, maxEntries func(i int) int, stop bool) {
	const (
		dests   = 3
		callers = 80
		each    = 12
		slack   = 20 * time.Second
	)
	system := testinst.System()
	t.Cleanup(system.Shutdown)
	inst, err := actors.Start(system, actors.Config{Name: "bufs", SinkConcurrency: sinkConcurrency})
	require.NoError(t, err)
	u := &unruly{last: map[string]verdict{}, accepted: map[string]int{}}
	codecs := make([]*fakecodec.Codec, dests)
	for i := range codecs {
		c := fakecodec.New(fmt.Sprint("unruly", i), codec.Limits{MaxEntries: maxEntries(i), MaxBytes: 1 << 20})
		c.Tune = codec.Tuning{Linger: time.Millisecond}
		c.Hook = u.hook
		c.Discard = true
		codecs[i] = c
	}
	type answer struct {
		body string
		id   string
		err  error
	}
	answers := make(chan answer, callers*each)
	var (
		wg       sync.WaitGroup
		finished atomic.Int64
		stopErr  = make(chan error, 1)
		stopOnce sync.Once
	)
	stopAt := int64(callers * each * (5 + rand.IntN(4)) / 10)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("g%d-%d", g, i)
				if rand.IntN(5) == 0 {
					body = "bad" + body
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := inst.Deliver(ctx, codecs[rand.IntN(dests)], codec.Message{Tenant: fmt.Sprint("t", g%5), Body: []byte(body)})
				cancel()
				answers <- answer{body: body, id: id, err: err}
				if finished.Add(1) == stopAt && stop {
					stopOnce.Do(func() {
						go func() {
							// Ends while requests are in flight: they are
							// cancelled and their callers answered
							// ErrStopped.
							ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(3))*time.Millisecond)
							defer cancel()
							stopErr <- inst.Stop(ctx)
						}()
					})
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(slack):
		require.FailNow(t, "callers hang", "%d of %d calls returned", finished.Load(), callers*each)
	}
	close(answers)
	if stop {
		select {
		case <-stopErr:
		case <-time.After(slack):
			require.FailNow(t, "Stop hangs")
		}
	}
	_ = inst.Stop(context.Background())
	assert.Equal(t, actors.Stats{}, inst.Stats())

	u.mu.Lock()
	defer u.mu.Unlock()
	assert.Empty(t, u.moved, "a batch changed while the codec held it")
	var kinds [vVerdicts + 2]int
	for a := range answers {
		v := u.last[a.body]
		switch {
		case a.err == nil:
			kinds[vOK]++
			assert.Equal(t, "id-"+a.body, a.id, "%s got another message's id", a.body)
			assert.Equal(t, vOK, v, "%s answered ok, but the codec's last word on it was %d", a.body, v)
		case errors.Is(a.err, messages.ErrStopped):
			kinds[vVerdicts]++
		case errors.Is(a.err, context.DeadlineExceeded):
			kinds[vVerdicts+1]++
		case errors.Is(a.err, codec.ErrResultCount):
			kinds[vCount]++
			assert.Contains(t, []verdict{vCount, vNone}, v, "%s: %v", a.body, a.err)
			assert.False(t, codec.IsPermanent(a.err))
		case errors.Is(a.err, codec.ErrCodecPanic):
			kinds[vPanic]++
			assert.Contains(t, []verdict{vPanic, vNone}, v, "%s: %v", a.body, a.err)
			assert.False(t, codec.IsPermanent(a.err))
		case errors.Is(a.err, codec.ErrRefused):
			kinds[vRefused]++
			assert.Equal(t, vRefused, v, "%s: %v", a.body, a.err)
			assert.True(t, strings.HasPrefix(a.body, "bad"), "%s refused", a.body)
			assert.True(t, codec.IsPermanent(a.err))
		default:
			var ee *codec.EntryError
			if assert.ErrorAs(t, a.err, &ee, "%s: %v", a.body, a.err) {
				kinds[vEntry]++
				assert.Equal(t, "E-"+a.body, ee.Code, "%s got another message's entry error", a.body)
				assert.Equal(t, vEntry, v, "%s: %v", a.body, a.err)
				assert.False(t, codec.IsPermanent(a.err), "%s: %v", a.body, a.err)
			}
		}
	}
	for b, n := range u.accepted {
		assert.Equal(t, 1, n, "body %s accepted %d times", b, n)
	}
	assert.Positive(t, kinds[vOK])
	assert.Positive(t, kinds[vRefused], "some requests were bisected down to a bad message")
	t.Logf("answers: ok %d, entry %d, count %d, panic %d, refused %d, stopped %d, deadline %d; codec verdicts %v",
		kinds[vOK], kinds[vEntry], kinds[vCount], kinds[vPanic], kinds[vRefused], kinds[vVerdicts], kinds[vVerdicts+1], u.seen)
}

// reusing is a codec's SendBatch that hands back the same results slice
// every time (a pool of its own), and writes it again on its next request;
// its destination sends one request at a time, so no two of its requests
// run at once. It refuses any request of more than one message holding a
// "bad" body, so that halves of a bisection reuse the slice one after the
// other.
type reusing struct {
	res []codec.Result
}

func (r *reusing) hook(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
	bad := false
	for _, m := range batch {
		bad = bad || strings.HasPrefix(string(m.Body), "bad")
	}
	if bad && len(batch) > 1 {
		return nil, fmt.Errorf("reusing: %w", codec.ErrRefused)
	}
	if cap(r.res) < len(batch) {
		r.res = make([]codec.Result, 64)
	}
	res := r.res[:len(batch)]
	for i, m := range batch {
		res[i] = codec.Result{ID: "id-" + string(m.Body)}
		if strings.HasPrefix(string(m.Body), "bad") {
			res[i] = codec.Result{Err: &codec.EntryError{Code: "E-" + string(m.Body), Permanent: true}}
		}
	}
	return res, nil
}

// A codec whose results slice is its own, handed back by every request and
// overwritten by the next (one at a time, as its MaxInflight says), while
// the batcher bisects: the batcher takes each request's results before it
// makes the next, so every caller gets its own id or its own entry error.
func TestACodecReusingItsResultsSliceAnswersEachCaller(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "reuse"})
	c := fakecodec.New("reuse", codec.Limits{MaxEntries: 16, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 1}
	c.Hook = (&reusing{}).hook
	c.Discard = true
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 20 {
				body := fmt.Sprintf("g%d-%d", g, i)
				if (g+i)%7 == 0 {
					body = "bad" + body
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint("t", g%4), Body: []byte(body)})
				cancel()
				if strings.HasPrefix(body, "bad") {
					var ee *codec.EntryError
					if assert.ErrorAs(t, err, &ee, body) {
						assert.Equal(t, "E-"+body, ee.Code, "%s got another message's error", body)
					}
					continue
				}
				if assert.NoError(t, err, body) {
					assert.Equal(t, "id-"+body, id, "%s got another message's id", body)
				}
			}
		})
	}
	wg.Wait()
}
