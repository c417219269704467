package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// A Deliver call's record serves later calls once both the call and its
// batcher have let go of it: a record reused while its batcher could still
// answer through it would hand one caller another's answer. Many callers
// deliver messages of their own through a codec that answers each with its
// body as its id, after a request time of its own; a third of them give up
// at once or shortly after (cancel), while their messages are queued or in
// flight, a third have deadlines that pass meanwhile, so records are let
// go of in every order while new calls take them. Every caller answered
// without an error must get its own message's id, a caller with time to
// spare that did not give up must get no error at all, and some cancelled
// callers' messages must have been sent and answered after their callers
// gave up (the late answers that make the order matter). The same holds
// when deliveries wait for room (WhenFull Block: their entries are never
// released) and when the instance traces (the caller ends its create span).
func TestARecordIsNeverReusedWhileItsBatcherCanAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        actors.Config
		tune       codec.Tuning
		goroutines int
		groups     bool // each caller's messages are of one of 4 groups
	}{
		{name: "refuse", goroutines: 32},
		// 20 callers never outnumber QueueMax queued plus QueueMax waiting:
		// none is refused for fullness.
		{name: "block", tune: codec.Tuning{WhenFull: codec.Block, QueueMax: 10}, goroutines: 20},
		{name: "block-groups", tune: codec.Tuning{WhenFull: codec.Block, QueueMax: 10}, goroutines: 20, groups: true},
		{name: "traced", cfg: actors.Config{TracerProvider: sdktrace.NewTracerProvider()}, goroutines: 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Name = "reuse-" + tc.name
			tc.tune.Linger, tc.tune.MaxInflight = 50*time.Microsecond, 4
			checkNoReuse(t, tc.cfg, tc.tune, tc.goroutines, tc.groups)
		})
	}
}

// checkNoReuse is TestARecordIsNeverReusedWhileItsBatcherCanAnswer for an
// instance configured with cfg, a destination tuned with tune, and
// goroutines callers, whose messages are of 4 groups if groups is set.
func checkNoReuse(t *testing.T, cfg actors.Config, tune codec.Tuning, goroutines int, groups bool) {
	const (
		each   = 300
		within = 30 * time.Second
	)
	if tp, ok := cfg.TracerProvider.(*sdktrace.TracerProvider); ok {
		t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	}
	_, inst := start(t, cfg)
	c := fakecodec.New(cfg.Name, codec.Limits{MaxEntries: 16, MaxBytes: 1 << 20})
	c.Tune = tune
	c.Latency, c.Jitter, c.Discard = 300*time.Microsecond, 250*time.Microsecond, true
	var sentMu sync.Mutex
	sent := map[string]bool{} // bodies of cancelled calls' messages that were sent
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		sentMu.Lock()
		for i, m := range batch {
			res[i].ID = string(m.Body)
			if m.Body[0] == 'c' {
				sent[string(m.Body)] = true
			}
		}
		sentMu.Unlock()
		return res, nil
	}

	var (
		answered, expired atomic.Int64
		cancelledMu       sync.Mutex
		cancelled         []string
		wg                sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range each {
				var (
					ctx    context.Context
					cancel context.CancelFunc
					body   string
				)
				switch i % 3 {
				case 0: // gives up: at once, or within 600µs
					body = fmt.Sprintf("c%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), within)
					if after := time.Duration(r.IntN(600)) * time.Microsecond; after < 50*time.Microsecond {
						cancel()
					} else {
						time.AfterFunc(after, cancel)
					}
				case 1: // its deadline passes while queued or in flight, or not
					body = fmt.Sprintf("d%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(100+r.IntN(900))*time.Microsecond)
				default:
					body = fmt.Sprintf("w%d-%d", g, i)
					ctx, cancel = context.WithTimeout(context.Background(), within)
				}
				m := codec.Message{Tenant: fmt.Sprint("t", g%4), Body: []byte(body)}
				if groups {
					m.Group = fmt.Sprint("g", g%4)
				}
				id, err := inst.Deliver(ctx, c, m)
				cancel()
				switch {
				case err == nil:
					if !assert.Equal(t, body, id, "a caller got another message's id") {
						return
					}
					answered.Add(1)
				case body[0] == 'c' && errors.Is(err, context.Canceled):
					cancelledMu.Lock()
					cancelled = append(cancelled, body)
					cancelledMu.Unlock()
				case body[0] == 'd' && errors.Is(err, context.DeadlineExceeded):
					expired.Add(1)
				default:
					// A caller that neither gave up nor ran out of time
					// answered with an error is another call's answer.
					assert.NoError(t, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	late := 0
	sentMu.Lock()
	for _, b := range cancelled {
		if sent[b] {
			late++
		}
	}
	sentMu.Unlock()
	t.Logf("answered %d, expired %d, cancelled %d (of which sent: %d)", answered.Load(), expired.Load(), len(cancelled), late)
	assert.Positive(t, answered.Load(), "callers answered")
	assert.Positive(t, expired.Load(), "callers whose deadline passed")
	assert.Positive(t, late, "cancelled callers whose message was sent and answered after they gave up")
}

// resumeTrap is a slog.Handler that, on the first "group resumed" record a
// retry logs, tells entered, waits for proceed and panics: the batcher's
// actor is held inside its handling of the retry's Deliver, after the
// retry was queued, and then crashes there.
type resumeTrap struct {
	entered, proceed chan struct{}
	once             *sync.Once
}

func (h resumeTrap) Enabled(context.Context, slog.Level) bool { return true }
func (h resumeTrap) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h resumeTrap) WithGroup(string) slog.Handler            { return h }
func (h resumeTrap) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sinkbatch: group resumed" {
		return nil
	}
	retry := false
	r.Attrs(func(a slog.Attr) bool {
		retry = retry || (a.Key == "by" && a.Value.String() == "retry")
		return true
	})
	if !retry {
		return nil
	}
	trapped := false
	h.once.Do(func() { trapped = true })
	if !trapped {
		return nil
	}
	close(h.entered)
	<-h.proceed
	panic("the logger panicked")
}

// A delivery is no longer the batcher's current one once it is queued: a
// request goroutine may then send it, answer it and let go of its record,
// which serves another call at once. Here the actor crashes (its logger
// panics) while still handling a retry that resumed its group, after a
// request goroutine has sent and answered that retry, its caller has
// returned, and new callers of another destination have taken records.
// The restart answers what the crashed incarnation held with
// ErrBatcherDown; had it still held the retry as its current delivery, it
// would answer that through a record that now belongs to another call,
// which would get ErrBatcherDown from a destination that never restarted.
func TestACrashAfterQueuingAnswersNoRecordItLetGo(t *testing.T) {
	const within = 10 * time.Second
	trap := resumeTrap{entered: make(chan struct{}), proceed: make(chan struct{}), once: &sync.Once{}}
	_, inst := start(t, actors.Config{Name: "reuse-current", Logger: slog.New(trap)})

	// One destination, one request at a time, next to no linger: "p" waits for
	// the valve, "a0" fails retryably (its group pauses), anything else
	// is answered its body as its id.
	valve := make(chan struct{})
	entered := make(chan struct{}, 1)
	// A failed test must not leave the actor or a request held: Stop
	// would wait for them.
	openValve, proceed := closeOnceFunc(t, valve), closeOnceFunc(t, trap.proceed)
	c := fakecodec.New("reuse-current", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Nanosecond, MaxInflight: 1, StrictGroups: true}
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			switch string(m.Body) {
			case "p":
				entered <- struct{}{}
				select {
				case <-valve:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			case "a0":
				res[i].Err = fmt.Errorf("retryable failure of %s", m.Body)
				continue
			}
			res[i].ID = string(m.Body)
		}
		return res, nil
	}
	deliver := func(tenant, group, key, body string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return inst.Deliver(ctx, c, codec.Message{Tenant: tenant, Group: group, IdempotencyKey: key, Body: []byte(body)})
	}
	type answer struct {
		id  string
		err error
	}
	async := func(f func() (string, error)) chan answer {
		ch := make(chan answer, 1)
		go func() { id, err := f(); ch <- answer{id, err} }()
		return ch
	}

	_, err := deliver("a", "g", "k1", "a0")
	require.Error(t, err, "a0 fails and pauses g")
	plug := async(func() (string, error) { return deliver("p", "", "", "p") })
	<-entered // p holds the one request slot
	retry := async(func() (string, error) { return deliver("a", "g", "k1", "a1") })
	<-trap.entered // the actor has queued a1 and logs that g resumed

	// p's request ends; its goroutine takes a1 for the slot, sends it and
	// answers it: a1's record is let go of by both parties.
	openValve()
	require.Equal(t, answer{id: "p"}, <-plug)
	require.Equal(t, answer{id: "a1"}, <-retry)

	// New calls take records from the pool, one likely a1's, and wait
	// for another destination's valve.
	const others = 64
	valve2 := make(chan struct{})
	openValve2 := closeOnceFunc(t, valve2)
	var sent2 atomic.Int64
	c2 := fakecodec.New("reuse-current2", codec.Limits{MaxEntries: others, MaxBytes: 1 << 20})
	c2.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 1}
	c2.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		sent2.Add(int64(len(batch)))
		select {
		case <-valve2:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			res[i].ID = string(m.Body)
		}
		return res, nil
	}
	var wg sync.WaitGroup
	for i := range others {
		body := fmt.Sprint("b", i)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			id, err := inst.Deliver(ctx, c2, codec.Message{Tenant: "b", Body: []byte(body)})
			if assert.NoError(t, err, "%s: its destination never restarted", body) {
				assert.Equal(t, body, id)
			}
		})
	}
	require.Eventually(t, func() bool { return sent2.Load()+int64(inst.Stats().Queued) == others }, within, time.Millisecond,
		"every new call holds its record, queued or in the held request")

	// The actor crashes in its handling of a1 and restarts; a delivery
	// after it is answered by the next incarnation, once the crashed one
	// has answered what it held.
	proceed()
	id, err := deliver("a", "", "k2", "after")
	require.NoError(t, err)
	require.Equal(t, "after", id)
	openValve2()
	wg.Wait()
}

// closeOnceFunc returns a function that closes ch once, and closes it when
// the test ends if it has not been.
func closeOnceFunc(t *testing.T, ch chan struct{}) func() {
	var once sync.Once
	f := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(f)
	return f
}

// A Deliver call's record (its Deliver, sender PID, Direct and Room) serves
// a later call once the call and its batcher have both let go of it. These
// tests drive every path of the batcher that holds an entry while callers
// give up, retry and come back, on records that are reused as fast as the
// pool hands them out; if a batcher read or answered through a record after
// letting go of it, a message would be sent with another call's tenant,
// group, key or body, or a caller would get another call's answer.
//
// Each attempt's body names its tenant, group, key and attempt
// (reuseBody), so that the codec checks every message it is sent against
// itself, and every answer, an id or an error, is checked against the
// caller that gets it (reuseLoad.check).

// reuseBody is the body of attempt a of call i of goroutine g.
func reuseBody(tenant, group, key string, a int) string {
	return fmt.Sprintf("%s|%s|%s|%d", tenant, group, key, a)
}

// reuseErr is the codec's retryable failure of one message: it names the
// message, so that the caller it reaches can tell it is its own.
type reuseErr struct{ body string }

func (e *reuseErr) Error() string { return "retryable failure of " + e.body }

// reuseDest is a fake destination whose requests answer each message with
// its body as its id, except what its scenario fails: a message whose key
// ends in "r" fails retryably on its first attempt (reuseErr); a request
// holding a message whose key ends in "x" is refused as a whole (the batcher
// bisects down to it: the refusal names it); every throttleEvery-th request
// is throttled as a whole. It counts what contradicts the promise: a
// message whose fields are not its body's, and a message accepted twice.
type reuseDest struct {
	*fakecodec.Codec
	throttleEvery int64
	requests      atomic.Int64
	mu            sync.Mutex
	accepted      map[string]bool
	broken        []string
}

func newReuseDest(id string, lim codec.Limits, tune codec.Tuning) *reuseDest {
	d := &reuseDest{Codec: fakecodec.New(id, lim), accepted: map[string]bool{}}
	d.Tune = tune
	d.Discard = true
	d.Hook = d.send
	return d
}

func (d *reuseDest) fail(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.broken) < 20 {
		d.broken = append(d.broken, fmt.Sprintf(format, args...))
	}
}

func (d *reuseDest) send(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
	n := d.requests.Add(1)
	for _, m := range batch {
		parts := strings.Split(string(m.Body), "|")
		if len(parts) != 4 || parts[0] != m.Tenant || parts[1] != m.Group || parts[2] != m.IdempotencyKey {
			d.fail("message sent as tenant %q group %q key %q with body %q", m.Tenant, m.Group, m.IdempotencyKey, m.Body)
		}
	}
	if d.throttleEvery > 0 && n%d.throttleEvery == 0 {
		return nil, &codec.EntryError{Code: "Throttled", Throttled: true}
	}
	for _, m := range batch {
		if strings.HasSuffix(m.IdempotencyKey, "x") {
			return nil, fmt.Errorf("%w: %s", codec.ErrRefused, m.Body)
		}
	}
	res := make([]codec.Result, len(batch))
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, m := range batch {
		body := string(m.Body)
		if strings.HasSuffix(m.IdempotencyKey, "r") && strings.HasSuffix(body, "|0") {
			res[i].Err = &reuseErr{body: body}
			continue
		}
		if d.accepted[body] {
			d.broken = append(d.broken, "accepted twice: "+body)
		}
		d.accepted[body] = true
		res[i].ID = body
	}
	return res, nil
}

func (d *reuseDest) Broken() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.broken...)
}

// reuseLoad is a scenario: goroutines each make calls, one after another,
// through inst to dest.
type reuseLoad struct {
	system     *actor.ActorSystem // if set, odd goroutines call in the actor form
	inst       *actors.Instance
	dest       *reuseDest
	goroutines int
	calls      int
	groups     int     // groups g0.. ; a fifth of the calls are ungrouped
	retryable  int     // one call in this many fails retryably at first (0: none)
	refused    int     // one call in this many is refused (0: none)
	resume     bool    // a caller told its group is paused resumes it
	noDeadline bool    // some calls carry no deadline (DefaultTimeout bounds them)
	giveUp     float64 // share of the calls whose ctx ends early
	within     time.Duration
	// defaultTimeout is the instance's Config.DefaultTimeout, if noDeadline.
	defaultTimeout time.Duration
	full           bool // calls may be refused for fullness
	restarts       bool // the batcher restarts: calls may get ErrBatcherDown
}

// reuseTally counts outcomes.
type reuseTally struct {
	ok, retried, refused, paused, resumed, gaveUp, full, down, throttled atomic.Int64
}

func (l *reuseLoad) run(t *testing.T) *reuseTally {
	t.Helper()
	var tally reuseTally
	var wg sync.WaitGroup
	for g := range l.goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 6))
			for i := range l.calls {
				if !l.call(t, r, g, i, &tally) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, l.dest.Broken(), "what the destination was sent")
	t.Logf("ok %d, retried %d, refused %d, paused %d (resumed %d), gave up %d, full %d, down %d, throttled %d",
		tally.ok.Load(), tally.retried.Load(), tally.refused.Load(), tally.paused.Load(), tally.resumed.Load(),
		tally.gaveUp.Load(), tally.full.Load(), tally.down.Load(), tally.throttled.Load())
	return &tally
}

// call makes call i of goroutine g, retrying a retryable failure of its
// own up to three times with the same key; false stops the goroutine.
func (l *reuseLoad) call(t *testing.T, r *rand.Rand, g, i int, tally *reuseTally) bool {
	tenant := "t" + strconv.Itoa(g%3)
	group := ""
	if l.groups > 0 && i%5 != 0 {
		group = "g" + strconv.Itoa(r.IntN(l.groups))
	}
	key := fmt.Sprintf("k%d-%d", g, i)
	switch {
	case l.refused > 0 && r.IntN(l.refused) == 0:
		key += "x"
	case l.retryable > 0 && r.IntN(l.retryable) == 0:
		key += "r"
	}
	for a := range 4 {
		body := reuseBody(tenant, group, key, a)
		if l.system != nil && g%2 == 1 {
			again, ok := l.future(t, r, call{body: body, group: group, key: key}, tenant, tally)
			if !ok {
				return false
			}
			if !again {
				return true
			}
			tally.retried.Add(1)
			continue
		}
		ctx, cancel := l.context(r)
		start := time.Now()
		id, err := l.inst.Deliver(ctx, l.dest, codec.Message{Tenant: tenant, Group: group, IdempotencyKey: key, Body: []byte(body)})
		// The ctx as the answer found it: an answer that says the ctx
		// ended, or the deadline passed, must be the call's own.
		ended, deadline := ctx.Err(), time.Now()
		if d, ok := ctx.Deadline(); ok {
			deadline = d
		} else if l.defaultTimeout > 0 {
			deadline = start.Add(l.defaultTimeout)
		}
		cancel()
		again, ok := l.check(t, call{body: body, group: group, key: key, ended: ended, deadline: deadline}, id, err, tally)
		if !ok {
			return false
		}
		if !again {
			return true
		}
		tally.retried.Add(1)
	}
	return true
}

// future is one attempt in the actor form, a RequestFuture whose
// Deliver names no Room: its entry is the batcher's own, sent in the same
// requests as the front door's. A share of the futures time out early:
// their callers are gone (the process registry says so).
func (l *reuseLoad) future(t *testing.T, r *rand.Rand, c call, tenant string, tally *reuseTally) (again, ok bool) {
	c.deadline = time.Now().Add(l.within)
	timeout := l.within + time.Second
	if r.Float64() < l.giveUp {
		timeout = time.Duration(50+r.IntN(1500)) * time.Microsecond
	}
	d := &messages.Deliver{Codec: l.dest, Message: codec.Message{Tenant: tenant, Group: c.group, IdempotencyKey: c.key, Body: []byte(c.body)}, Deadline: c.deadline}
	// A reply actor of the test's own rather than protoactor's Future,
	// whose result is written outside its lock: a reply racing its timeout
	// is a data race in protoactor (PROTOACTOR.md), not in sinkbatch.
	replies := make(chan any, 1)
	caller := l.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, system := c.Message().(actor.SystemMessage); !system {
			select {
			case replies <- c.Message():
			default:
			}
		}
	}))
	defer l.system.Root.Stop(caller)
	l.system.Root.RequestWithCustomSender(l.inst.PID(), d, caller)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var res any
	select {
	case res = <-replies:
	case <-timer.C:
		tally.gaveUp.Add(1)
		return false, true
	}
	dl, isDelivered := res.(*messages.Delivered)
	if !assert.True(t, isDelivered, "%T", res) {
		return false, false
	}
	return l.check(t, c, dl.ID, dl.Err, tally)
}

// context is a call's: most have time to spare; a share end early, at once
// or within a millisecond; with noDeadline some have none.
func (l *reuseLoad) context(r *rand.Rand) (context.Context, context.CancelFunc) {
	if r.Float64() < l.giveUp {
		if r.IntN(2) == 0 {
			ctx, cancel := context.WithCancel(context.Background())
			if after := time.Duration(r.IntN(1000)) * time.Microsecond; after < 50*time.Microsecond {
				cancel()
			} else {
				time.AfterFunc(after, cancel)
			}
			return ctx, cancel
		}
		return context.WithTimeout(context.Background(), time.Duration(50+r.IntN(1500))*time.Microsecond)
	}
	if l.noDeadline && r.IntN(3) == 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), l.within)
}

// call is one attempt as check sees it: what it sent, and its ctx once
// answered.
type call struct {
	body, group, key string
	ended            error     // ctx.Err() when Deliver returned
	deadline         time.Time // its ctx's, or start + DefaultTimeout
}

// check checks one answer against the call that got it: an id must be the
// call's own body; an error that names a message or a group must name the
// call's; an error that says the call's ctx ended or its deadline passed
// must come after that happened; an error that only some scenarios give
// (a refusal for fullness, a restart, throttling) must be one of this
// scenario's. again: the failure is the call's own and retryable, or its
// group paused (after a resume, if the scenario resumes).
func (l *reuseLoad) check(t *testing.T, c call, id string, err error, tally *reuseTally) (again, ok bool) {
	var (
		mine   *reuseErr
		paused *messages.GroupPausedError
		full   *messages.RetryAfterError
	)
	switch {
	case err == nil:
		tally.ok.Add(1)
		return false, assert.Equal(t, c.body, id, "a caller got another message's id")
	case errors.As(err, &mine):
		return true, assert.Equal(t, c.body, mine.body, "a caller got another message's failure")
	case errors.Is(err, codec.ErrRefused):
		tally.refused.Add(1)
		ok := assert.True(t, strings.HasSuffix(err.Error(), ": "+c.body), "a caller got another message's refusal: %v (sent %s)", err, c.body)
		return false, ok && assert.True(t, strings.HasSuffix(c.key, "x"), "%s refused", c.body)
	case errors.As(err, &paused):
		tally.paused.Add(1)
		if !assert.Equal(t, c.group, paused.Group, "a caller got another group's pause (sent %s)", c.body) {
			return false, false
		}
		if l.resume && paused.Key != c.key {
			if rerr := l.inst.ResumeGroup(context.Background(), l.dest, c.group); !assert.NoError(t, rerr) {
				return false, false
			}
			tally.resumed.Add(1)
		}
		return true, true
	case errors.Is(err, context.Canceled):
		tally.gaveUp.Add(1)
		return false, assert.ErrorIs(t, c.ended, context.Canceled, "a caller whose ctx was not cancelled got %v (sent %s)", err, c.body)
	case errors.Is(err, context.DeadlineExceeded):
		tally.gaveUp.Add(1)
		return false, assert.False(t, time.Now().Before(c.deadline), "a caller got %v %v before its deadline (sent %s)", err, time.Until(c.deadline), c.body)
	case errors.As(err, &full) && l.full:
		tally.full.Add(1)
		return false, true
	case errors.Is(err, messages.ErrBatcherDown) && l.restarts:
		tally.down.Add(1)
		return false, true
	case codec.IsThrottled(err) && l.dest.throttleEvery > 0:
		tally.throttled.Add(1)
		return false, true
	}
	return false, assert.NoError(t, err, "an answer no call of this scenario gets (sent %s)", c.body)
}

// StrictGroups with retryable failures: the failed entry's request pauses
// its group, whose queued entries are answered GroupPausedError by the
// request goroutine (settle); the caller retries with the same key, which
// resumes the group, or resumes it itself. Meanwhile a share of the callers
// give up while their entries are queued or in flight.
func TestRecordReuseUnderStrictGroupsRetriesAndResumes(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "reuse-strict"})
	dest := newReuseDest("reuse-strict", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 4, StrictGroups: true, GroupPauseMax: 20 * time.Millisecond})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 24, calls: 150, groups: 6, retryable: 6, resume: true, giveUp: 0.3, within: 10 * time.Second}
	tally := l.run(t)
	assert.Positive(t, tally.retried.Load())
	assert.Positive(t, tally.paused.Load())
	assert.Positive(t, tally.gaveUp.Load())
}

// Refused requests bisect down to the refused message, in halves whose
// groups are held back after a retryable failure (bisectHolding); every
// caller of a bisected request is answered from the halves' results.
func TestRecordReuseUnderBisectedRequests(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "reuse-bisect"})
	dest := newReuseDest("reuse-bisect", codec.Limits{MaxEntries: 16, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 200 * time.Microsecond, MaxInflight: 3, StrictGroups: true, GroupPauseMax: 20 * time.Millisecond})
	dest.Latency, dest.Jitter = 200*time.Microsecond, 150*time.Microsecond
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 24, calls: 120, groups: 4, retryable: 8, refused: 10, giveUp: 0.3, within: 10 * time.Second}
	tally := l.run(t)
	assert.Positive(t, tally.refused.Load())
	assert.Positive(t, tally.retried.Load())
}

// WhenFull Block: deliveries that do not fit wait for room, are promoted
// by request goroutines as batches leave, and give up while waiting;
// entries that waited are never let go of by the batcher.
func TestRecordReuseUnderBlockedDeliveries(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "reuse-block"})
	dest := newReuseDest("reuse-block", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 2, QueueMax: 6, WhenFull: codec.Block, StrictGroups: true, GroupPauseMax: 20 * time.Millisecond})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 24, calls: 120, groups: 3, retryable: 10, resume: true, giveUp: 0.4, within: 10 * time.Second, full: true}
	tally := l.run(t)
	assert.Positive(t, tally.ok.Load())
	assert.Positive(t, tally.gaveUp.Load())
}

// Adaptive with throttled requests, and calls with no deadline whose
// DefaultTimeout (a waiter's timer, not a ctx) runs out around their
// answer.
func TestRecordReuseUnderAdaptiveAndDefaultTimeout(t *testing.T) {
	_, inst := start(t, actors.Config{Name: "reuse-adaptive", DefaultTimeout: 700 * time.Microsecond})
	dest := newReuseDest("reuse-adaptive", codec.Limits{MaxEntries: 8, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 6, Adaptive: true})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	dest.throttleEvery = 7
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 24, calls: 150, noDeadline: true, defaultTimeout: 700 * time.Microsecond, giveUp: 0.2, within: 10 * time.Second}
	tally := l.run(t)
	assert.Positive(t, tally.ok.Load())
	assert.Positive(t, tally.throttled.Load())
}

// Traced: each send span links the create spans of its entries, read
// from the entries while the request runs.
func TestRecordReuseUnderTracing(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, inst := start(t, actors.Config{Name: "reuse-traced", TracerProvider: tp})
	dest := newReuseDest("reuse-traced", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 4, StrictGroups: true, GroupPauseMax: 20 * time.Millisecond})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 16, calls: 120, groups: 4, retryable: 8, refused: 12, resume: true, giveUp: 0.3, within: 10 * time.Second}
	tally := l.run(t)
	assert.Positive(t, tally.ok.Load())
}

// Actor-form deliveries (futures, some of which time out while their
// entries are queued or in flight) share the batcher and its requests
// with the front door's: only the front door's entries have a Room to let
// go of.
func TestRecordReuseMixedWithTheActorForm(t *testing.T) {
	system, inst := start(t, actors.Config{Name: "reuse-mixed"})
	dest := newReuseDest("reuse-mixed", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 4, StrictGroups: true, GroupPauseMax: 20 * time.Millisecond})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	l := &reuseLoad{system: system, inst: inst, dest: dest, goroutines: 24, calls: 120, groups: 4, retryable: 8, refused: 12, resume: true, giveUp: 0.3, within: 10 * time.Second}
	tally := l.run(t)
	assert.Positive(t, tally.ok.Load())
	assert.Positive(t, tally.gaveUp.Load())
}

// crashingRecorder is a Recorder whose Refused panics every few calls, which
// restarts the batcher while it holds queued and in-flight entries: the
// crashed incarnation answers them ErrBatcherDown, its request goroutines
// finish their requests and answer only what they still claim.
type crashingRecorder struct {
	telemetry.Nop
	n atomic.Int64
}

func (r *crashingRecorder) Sink(string) telemetry.SinkRecorder { return r }

func (r *crashingRecorder) Refused(messages.FullReason) {
	if r.n.Add(1)%3 == 0 {
		panic("Refused")
	}
}

func TestRecordReuseUnderRestarts(t *testing.T) {
	rec := &crashingRecorder{}
	_, inst := start(t, actors.Config{Name: "reuse-restart", Recorder: rec})
	dest := newReuseDest("reuse-restart", codec.Limits{MaxEntries: 4, MaxBytes: 1 << 20},
		codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 2, QueueMax: 12, RetryAfterMax: time.Millisecond, StrictGroups: true, GroupPauseMax: 10 * time.Millisecond})
	dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
	l := &reuseLoad{inst: inst, dest: dest, goroutines: 24, calls: 100, groups: 3, retryable: 10, resume: true, giveUp: 0.2, within: 10 * time.Second, full: true, restarts: true}
	tally := l.run(t)
	assert.Positive(t, tally.down.Load(), "restarts")
	assert.Positive(t, tally.ok.Load())
}

// Stop with a context that ends at once, under load: the aborted batchers
// answer what they hold ErrStopped, their request goroutines answer what
// they still claim, and calls after Stop are refused before they get a
// record.
func TestRecordReuseUnderAnAbortedStop(t *testing.T) {
	for range 3 {
		system := quietSystem()
		inst, err := actors.Start(system, actors.Config{Name: "reuse-abort"})
		require.NoError(t, err)
		dest := newReuseDest("reuse-abort", codec.Limits{MaxEntries: 8, MaxBytes: 1 << 20},
			codec.Tuning{Linger: 100 * time.Microsecond, MaxInflight: 3})
		dest.Latency, dest.Jitter = 300*time.Microsecond, 250*time.Microsecond
		var (
			wg      sync.WaitGroup
			stopped atomic.Int64
			ok      atomic.Int64
		)
		for g := range 16 {
			wg.Go(func() {
				for i := 0; ; i++ {
					key := fmt.Sprintf("k%d-%d", g, i)
					body := reuseBody("t", "", key, 0)
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if i%4 == 3 {
						cancel()
					}
					id, err := inst.Deliver(ctx, dest, codec.Message{Tenant: "t", IdempotencyKey: key, Body: []byte(body)})
					cancel()
					switch {
					case err == nil:
						ok.Add(1)
						if !assert.Equal(t, body, id, "a caller got another message's id") {
							return
						}
					case errors.Is(err, messages.ErrStopped):
						if stopped.Add(1) > 50 {
							return
						}
					case errors.Is(err, context.Canceled):
					default:
						assert.NoError(t, err)
						return
					}
				}
			})
		}
		require.Eventually(t, func() bool { return ok.Load() > 200 }, 10*time.Second, time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = inst.Stop(ctx)
		wg.Wait()
		require.Empty(t, dest.Broken())
		system.Shutdown()
	}
}
