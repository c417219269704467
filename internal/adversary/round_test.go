package adversary_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// year2300 is a deadline past the year 2262, where UnixNano overflows.
var year2300 = time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)

// round is one instance, its destinations, its callers and what they saw.
type round struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand // the round's own choices; only the round's goroutine uses it
	slack time.Duration
	skip  map[string]bool

	system         *actor.ActorSystem
	inst           *actors.Instance
	name           string
	dests          []*dest
	defaultTimeout time.Duration
	quiesce        bool // traffic ends and the batchers must stop idle before Stop
	abandon        bool // half the Deliver callers give up within milliseconds of an hour-long deadline
	traffic        time.Duration
	pFlag          float64 // share of messages with a flag other than plain
	start          time.Time

	kill         chan struct{} // closed at the end: every caller still waiting gives up
	killCtx      context.Context
	killedAt     atomic.Int64
	trafficEnd   atomic.Bool
	stopCalled   atomic.Int64 // Unix nanoseconds; 0: not yet
	stopReturned atomic.Int64

	mu     sync.Mutex
	calls  []*call
	byID   map[uint64]*call
	byBody map[string]*call
	nextID atomic.Uint64

	vmu      sync.Mutex
	viol     map[string]*violation
	reported bool // report has judged the round; later violations go to late

	stalls  stalls
	stray   atomic.Int64
	logs    *logCounter
	supRest atomic.Int64 // SupervisorEvents: restarts the instance did not handle itself
	maxSeen actors.Stats

	// The round's telemetry (telemetry_test.go); nil when it has none.
	rec          *crashRecorder
	tp           *countingProvider
	spanRec      *tracetest.SpanRecorder
	callerTracer trace.Tracer
	sampler      string

	// Set by run and check, read by report.
	conc        int
	callers     int
	noSenders   int
	stopTimeout time.Duration
	stopErr     error
	answered    int
	acked       int
	excused     int // late answers excused by stalls
	outcomes    map[string]int
	spans       spanCounts
	crashes     int // panics in Recorder.Refused
	// The round's listening callers (listen_test.go); nil when it has none.
	listen       *listening
	listeners    int
	listenPanics int // panics in a listening caller's Listening
	recPanics    int // panics in Recorder.Answered, Waited and Flushed
}

type violation struct {
	n        int
	examples []string
}

// violate records a broken promise of kind; the round fails with it.
func (r *round) violate(kind, format string, args ...any) {
	r.vmu.Lock()
	defer r.vmu.Unlock()
	if r.reported {
		// A request goroutine broke a promise after the round was judged
		// (one that began before Stop returned with an error may still
		// run): TestMain fails the run with it.
		late.add(r.seed, kind, fmt.Sprintf(format, args...))
		return
	}
	v := r.viol[kind]
	if v == nil {
		v = &violation{}
		r.viol[kind] = v
	}
	v.n++
	if len(v.examples) < 3 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

func (r *round) on(feature string) bool { return !r.skip[feature] }

// call is one delivery attempt and what its caller got.
type call struct {
	r        *round
	id       uint64
	form     string      // deliver, actor, pipelined, future
	d        *dest       // nil: a nil codec
	codecVal codec.Codec // nil, or a typed nil, for the nil codec
	typedNil bool
	start    time.Time
	deadline time.Time // zero: DefaultTimeout
	dlClass  string
	cancelAt atomic.Int64
	sentAt   atomic.Int64      // when the codec first got the message; 0: never
	owner    string            // the group's owner, if the caller owns its group
	ownerSeq int               // the attempt's place in its owner's deliveries
	parent   trace.SpanContext // the caller's span, in a tracing round
	logical  int               // the owner's message this attempt carries
	msg      codec.Message
	body     string

	mu       sync.Mutex
	n        int
	at       time.Time
	err      error
	resID    string
	panicked any
	done     chan struct{} // closed at the first answer
	over     chan struct{} // closed when the caller stops waiting
	overOnce sync.Once
}

// finish notes that c's caller stopped waiting, answered or not.
func (c *call) finish() { c.overOnce.Do(func() { close(c.over) }) }

func (c *call) answer(at time.Time, id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n == 1 {
		c.at, c.resID, c.err = at, id, err
		close(c.done)
		c.finish()
	}
}

// effDeadline is when the caller's wait ends at the latest without Stop.
func (c *call) effDeadline() time.Time {
	dl := c.deadline
	if dl.IsZero() {
		dl = c.start.Add(c.r.defaultTimeout)
	}
	if ca := c.cancelAt.Load(); ca != 0 && time.Unix(0, ca).Before(dl) {
		dl = time.Unix(0, ca)
	}
	return dl
}

// checkSend is called by the codec when c's message is first sent; check
// looks at the time once the round is over.
func (c *call) checkSend(now time.Time) { c.sentAt.Store(now.UnixNano()) }

func (c *call) describe() string {
	dn := "nil codec"
	if c.d != nil {
		dn = fmt.Sprintf("%s(%T)", c.d.name, c.codecVal)
	}
	return fmt.Sprintf("%s call %d to %s, %s deadline, flag %q, started %v into the round", c.form, c.id, dn, c.dlClass, flagOf(c.msg), c.start.Sub(c.r.t0()))
}

func (r *round) t0() time.Time { return r.start }

// newCall registers a call.
func (r *round) newCall(rng *rand.Rand, form string, d *dest, owner string, ownerSeq, logical int) *call {
	c := &call{r: r, id: r.nextID.Add(1), form: form, d: d, owner: owner, ownerSeq: ownerSeq, logical: logical, done: make(chan struct{}), over: make(chan struct{})}
	c.deadline, c.dlClass = r.deadline(rng, owner != "")
	c.parent = r.parentSpan(rng)
	if r.abandon && c.dlClass != "past" {
		// No deadline passes during the traffic: nothing but a cancel the
		// batcher learns of, or its periodic sweep, frees abandoned room.
		c.deadline, c.dlClass = time.Now().Add(time.Hour), "hour"
	}
	if d != nil {
		c.codecVal = d.values[rng.IntN(len(d.values))]
		c.msg = r.message(rng, c, d, owner)
		c.body = bodyID(c.msg)
	} else {
		c.msg = codec.Message{Body: []byte(fmt.Sprintf(".%d:", c.id))}
		if r.on("typednil") && (!r.on("nilcodec") || rng.IntN(2) == 0) {
			c.codecVal, c.typedNil = (*ptrCodec)(nil), true
		}
	}
	c.start = time.Now()
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.byID[c.id] = c
	if c.body != "" {
		r.byBody[c.body] = c
	}
	r.mu.Unlock()
	return c
}

func (r *round) callByBody(id string) *call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byBody[id]
}

func (r *round) callByID(id uint64) *call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// deadline draws a caller's deadline: past ones, short ones, none, and ones
// after 2262. Owners draw no past deadlines, so that their groups move.
func (r *round) deadline(rng *rand.Rand, owner bool) (time.Time, string) {
	now := time.Now()
	for {
		x := rng.IntN(100)
		switch {
		case x < 8:
			if owner || !r.on("pastdeadline") {
				continue
			}
			return now.Add(-time.Duration(1 + rng.Int64N(int64(time.Hour)))), "past"
		case x < 40:
			return now.Add(time.Duration(1+rng.IntN(30)) * time.Millisecond), "short"
		case x < 72:
			return now.Add(time.Duration(30+rng.IntN(400)) * time.Millisecond), "medium"
		case x < 84:
			return time.Time{}, "none"
		case x < 92:
			if !r.on("farfuture") {
				continue
			}
			return year2300, "year2300"
		default:
			return now.Add(time.Hour), "hour"
		}
	}
}

var flags = []struct {
	flag    byte
	feature string
}{
	{flagSizePanic, "panicsize"},
	{flagNegSize, "negsize"},
	{flagInvalid, "invalid"},
	{flagValidatePanc, "panicvalidate"},
	{flagRefused, "refuse"},
	{flagEntryPerm, "entryfail"},
	{flagEntryRetry, "entryfail"},
	{flagEntryThrottl, "entryfail"},
}

// message draws a message for c: tenant, group, key, flag and size.
func (r *round) message(rng *rand.Rand, c *call, d *dest, owner string) codec.Message {
	m := codec.Message{Tenant: fmt.Sprintf("t%d", rng.IntN(1+d.idx*2+1))}
	switch {
	case owner != "":
		m.Group = owner
	case d.lim.OneGroupPerRequest && rng.IntN(3) == 0, rng.IntN(2) == 0:
		m.Group = fmt.Sprintf("r%d", rng.IntN(4))
	}
	switch rng.IntN(3) {
	case 0:
	case 1:
		m.IdempotencyKey = fmt.Sprintf("k%d", c.id)
	default:
		m.IdempotencyKey = fmt.Sprintf("k%d", rng.IntN(5))
	}
	flag := byte(flagPlain)
	if rng.Float64() < r.pFlag {
		f := flags[rng.IntN(len(flags))]
		if r.on(f.feature) && (d.validate || (f.flag != flagInvalid && f.flag != flagValidatePanc)) {
			flag = f.flag
		}
	}
	head := fmt.Sprintf("%c%d:", flag, c.id)
	limit := d.resolved.MaxBytes - len(m.Group)
	var n int
	switch x := rng.IntN(100); {
	case x < 75:
		n = len(head) + rng.IntN(32)
	case x < 95:
		n = len(head) + rng.IntN(max(limit-len(head), 1))
	default: // around the limit, some of them too large
		n = limit - 4 + rng.IntN(12)
	}
	n = max(n, len(head))
	body := make([]byte, n)
	copy(body, head)
	for i := len(head); i < n; i++ {
		body[i] = 'x'
	}
	m.Body = body
	return m
}

// stalls records the moments the process did not run: a ticker that should
// tick every few milliseconds and did not. A machine shared with other test
// runs stops a process for seconds now and then; an answer late by no more
// than the stalls it waited through is not held against the instance.
type stalls struct {
	mu   sync.Mutex
	gaps [][2]time.Time
}

// watch records gaps of more than 50ms between ticks until stop is closed.
func (s *stalls) watch(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			now = time.Now()
			if now.Sub(last) > 50*time.Millisecond {
				s.mu.Lock()
				s.gaps = append(s.gaps, [2]time.Time{last, now})
				s.mu.Unlock()
			}
			last = now
		}
	}
}

// within is how long the process stood still between from and to.
func (s *stalls) within(from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, g := range s.gaps {
		a, b := later(g[0], from), g[1]
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

// worst is the longest stall.
func (s *stalls) worst() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, g := range s.gaps {
		d = max(d, g[1].Sub(g[0]))
	}
	return d
}

// logCounter counts the instance's log lines by message.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (l *logCounter) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *logCounter) Handle(_ context.Context, rec slog.Record) error {
	l.mu.Lock()
	l.counts[rec.Message]++
	l.mu.Unlock()
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
func (l *logCounter) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

// outcome names the class of a delivery's answer.
func outcome(err error) string {
	var ra *messages.RetryAfterError
	var gp *messages.GroupPausedError
	var ee *codec.EntryError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, messages.ErrNilCodec):
		return "nilcodec"
	case errors.Is(err, messages.ErrStopped):
		return "stopped"
	case errors.Is(err, messages.ErrBatcherDown):
		return "down"
	case errors.As(err, &ra):
		return "full"
	case errors.As(err, &gp):
		return "paused"
	case errors.Is(err, codec.ErrTooLarge):
		return "toolarge"
	case errors.Is(err, codec.ErrCodecPanic):
		return "codecpanic"
	case errors.Is(err, codec.ErrResultCount):
		return "resultcount"
	case errors.Is(err, codec.ErrRefused):
		return "refused"
	case codec.IsThrottled(err):
		return "throttled"
	case errors.Is(err, context.DeadlineExceeded):
		return "expired"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.As(err, &ee) && ee.Permanent:
		return "permanent"
	case errors.As(err, &ee):
		return "retryable"
	case codec.IsPermanent(err):
		return "permanent" // a config error, a nil ctx
	case strings.Contains(err.Error(), "panicked"):
		return "metapanic" // a panic in Name, Identity, Limits or Tuning
	case strings.Contains(err.Error(), "Tuning."):
		return "config"
	}
	return "other"
}

// retryable says whether an owner tries the same message again.
func retryable(err error) bool {
	switch outcome(err) {
	case "full", "down", "codecpanic", "resultcount", "throttled", "retryable", "expired", "paused":
		return true
	}
	return false
}
