package batcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// Idle tells the batcher's parent that it has had nothing queued or in flight
// for its IdleTimeout, after receiving Received deliveries in all. The parent
// stops it only if it forwarded exactly that many.
type Idle struct {
	Who      *actor.PID
	Received uint64
}

// Drain tells a batcher that the instance is stopping: send everything
// queued at once, and report Drained once Expect deliveries have been
// received and every one of them is answered.
type Drain struct{ Expect uint64 }

// Drained is a batcher's answer to Drain.
type Drained struct{ Who *actor.PID }

// Abort tells a batcher to answer everything it holds with ErrStopped now:
// Stop's context expired.
type Abort struct{}

// tick wakes the batcher when linger, a deadline or its idle timeout runs out.
type tick struct{}

// done tells the batcher that a request has ended, so that it looks at
// what that changed: a slot may be free, the queue idle, a drain over.
type done struct{}

// theDone is the one done message; it carries nothing.
var theDone = &done{}

// failed carries a panic of the batcher's own code on a request goroutine
// (see next) to Receive, which panics with it so that the supervisor
// restarts the batcher, as it does for a panic in Receive.
type failed struct {
	from   *Batcher // the incarnation whose goroutine failed
	reason any
	stack  []byte
}

// GetPriority puts failed first in the mailbox.
func (*failed) GetPriority() int8 { return priorityFirst }

// inflight is a batch whose request is running. Each of its callers is
// answered exactly once, by whoever first claims its entry: the request
// goroutine with the result; the batcher when the caller's deadline passes
// first, or when it restarts or aborts.
type inflight struct {
	entries []*entry
	groups  []*lane
	ctx     context.Context
	cancel  context.CancelFunc
	trigger telemetry.Trigger
}

var (
	errExpired         = fmt.Errorf("sinkbatch: the deadline passed before the message was sent: %w", context.DeadlineExceeded)
	errExpiredInFlight = fmt.Errorf("sinkbatch: the deadline passed while the message's request was in flight; it may have been stored: %w", context.DeadlineExceeded)
)

// Props returns the props of a batcher for p's destination. Its mailbox
// lets done messages and ticks pass the deliveries waiting in it: they start
// requests for slots that no request goroutine took on, report idleness and
// end a drain, none of which should queue behind a burst of deliveries.
func Props(p *Params) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &Batcher{p: p} },
		actor.WithMailbox(actor.UnboundedPriorityMpsc()))
}

// Mailbox priorities (protoactor's default is 4).
const (
	priorityFirst = 7
	priorityTick  = 6
)

// GetPriority puts done messages first in the mailbox.
func (*done) GetPriority() int8 { return priorityFirst }

// GetPriority puts ticks before deliveries.
func (*tick) GetPriority() int8 { return priorityTick }

// Batcher is the actor that owns one destination's queue. It admits
// deliveries, decides when a batch goes out, runs each request on its own
// goroutine and answers every caller exactly once.
//
// A request goroutine whose request ends takes the next due batch itself,
// so that a busy destination's slot goes on at once instead of waiting for
// the batcher's turn to run, which on a loaded machine can be a good share
// of a short request. The batch is taken then, not earlier, so a tenant that
// turns up meanwhile is served by the same round-robin. mu guards every
// field but those set in Started: Receive holds it throughout, a request
// goroutine while it hands its slot on (next).
type Batcher struct {
	mu        sync.Mutex
	p         *Params
	system    *actor.ActorSystem
	self      *actor.PID
	log       *slog.Logger
	validator codec.Validator
	q         *queue
	running   map[*inflight]struct{} // the batches whose request is running
	own       int                    // this incarnation's request goroutines
	// no unanswered entry in a request has an earlier deadline; MaxInt64: none
	inflightDeadline int64
	aliveFn          func(*entry) bool
	tickMsg          *tick

	now          int64 // Unix nanoseconds when mu was last taken
	timer        *time.Timer
	armed        int64
	idleSince    int64
	idleReported bool
	down         bool // this incarnation crashed or stopped
	drainedSent  bool
	aborted      bool // Stop's context ended: every delivery is answered ErrStopped
	cancelsSeen  uint64
	// lastFullSweep is when a refusal for fullness last swept the queue.
	lastFullSweep int64
	// idleReportedAt is the received count the last Idle carried; a report
	// the supervisor could not act on (a delivery raced it) is made again.
	idleReportedAt uint64
	idleReportTime int64

	// The delivery being handled, until it is queued or answered: a panic
	// in between leaves it here for Restarting to answer.
	current       *messages.Deliver
	currentSender *actor.PID

	published struct {
		queued, inflight int
		bytes            int64
	}
}

// Receive handles one message. It never waits on a request: requests run on
// their own goroutines, which hold mu only to hand their slot on. If it
// panics, or a request goroutine's take does, this incarnation is down at
// once: nothing more is taken from its queue, which may be half changed,
// and until the restart a delivery is answered ErrBatcherDown.
func (b *Batcher) Receive(ctx actor.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	finished := false
	defer func() {
		if !finished {
			b.down = true
		}
	}()
	b.receive(ctx)
	finished = true
}

func (b *Batcher) receive(ctx actor.Context) {
	b.now = time.Now().UnixNano()
	switch m := ctx.Message().(type) {
	case *messages.Deliver:
		if b.down {
			// A request goroutine failed; the restart is on its way, and
			// the queue may be half changed.
			b.p.received++
			b.reply(ctx.Sender(), m, codec.Result{Err: messages.ErrBatcherDown})
			return
		}
		b.deliver(ctx.Sender(), m)
	case *done:
	case *tick:
		b.armed = 0
	case *Drain:
		b.p.drain = m
		b.q.draining = true
	case *Abort:
		b.aborted = true
		b.q.draining = true
		b.answerAll(messages.ErrStopped)
	case *failed:
		if m.from == b {
			panic(fmt.Sprintf("%v (on a request goroutine)\n%s", m.reason, m.stack))
		}
	case *actor.Started:
		b.start(ctx)
	case *actor.Restarting:
		b.down = true
		b.answerAll(messages.ErrBatcherDown)
		b.stopTimer()
		b.unpublish()
		return
	case *actor.Stopping:
		b.down = true
		b.answerAll(messages.ErrStopped)
		b.stopTimer()
		b.unpublish()
		return
	default:
		return
	}
	if !b.down {
		b.settle(ctx)
	}
}

func (b *Batcher) start(ctx actor.Context) {
	b.system = ctx.ActorSystem()
	b.self = ctx.Self()
	b.log = b.p.Logger
	b.validator, _ = b.p.Codec.(codec.Validator)
	b.q = newQueue(settingsOf(b.p.Tuning, b.p.OneGroup))
	b.q.draining = b.p.drain != nil // a restart does not end Stop's drain
	b.p.incarnations++
	b.running = make(map[*inflight]struct{})
	b.inflightDeadline = math.MaxInt64
	b.aliveFn = b.alive
	b.tickMsg = &tick{}
	if b.p.incarnations == 1 {
		b.log.Info("sinkbatch: batcher started")
	}
}

func (b *Batcher) deliver(sender *actor.PID, d *messages.Deliver) {
	b.p.received++
	if b.aborted {
		// Stop's context ended: what was still on its way is answered, not
		// queued.
		b.reply(sender, d, codec.Result{Err: messages.ErrStopped})
		return
	}
	b.current, b.currentSender = d, sender
	deadline := b.now + int64(b.p.DefaultTimeout)
	if !d.Deadline.IsZero() {
		deadline = unixNano(d.Deadline)
	}
	var err error
	if deadline <= b.now {
		err = errExpired
	} else {
		err = b.validate(d.Message)
	}
	size := 0
	if err == nil {
		size, err = b.size(d.Message)
	}
	if err == nil && size > b.p.Tuning.MaxBytes {
		err = fmt.Errorf("%w: %d bytes, one request takes at most %d", codec.ErrTooLarge, size, b.p.Tuning.MaxBytes)
	}
	if err != nil {
		b.current = nil
		b.reply(sender, d, codec.Result{Err: err})
		return
	}
	e := &entry{deliver: d, sender: sender, size: max(size, 0), deadline: deadline}
	reason, ok := b.q.admit(e, b.now)
	if !ok {
		// Room held by callers that gave up is not room: look for them
		// when one may have (a deadline passed, a Deliver caller
		// cancelled), and at most every fullSweepEvery otherwise, for the
		// actor callers that stopped waiting without saying so.
		if c := b.p.Cancels.Load(); b.now >= b.q.minDeadline || c != b.cancelsSeen || b.now-b.lastFullSweep >= int64(fullSweepEvery) {
			b.cancelsSeen, b.lastFullSweep = c, b.now
			b.answerDropped(b.q.sweep(b.now, b.aliveFn))
			reason, ok = b.q.admit(e, b.now)
		}
	}
	if !ok {
		// Still current: if the Recorder panics, the restart answers it.
		after := time.Duration(rand.Int64N(int64(b.p.Tuning.RetryAfterMax))) + 1
		b.p.Recorder.Refused(reason)
		b.current = nil
		b.reply(sender, d, codec.Result{Err: &messages.RetryAfterError{After: after, Reason: reason}})
		return
	}
	b.current = nil
}

// fullSweepEvery bounds how often a full queue is swept for callers that
// gave up without a cancel the batcher can see: a sweep costs O(queue).
const fullSweepEvery = 10 * time.Millisecond

// unixNano is t in Unix nanoseconds, saturated to the int64 range: a
// deadline past the year 2262 is "never", not an overflow into the past.
func unixNano(t time.Time) int64 {
	switch {
	case t.After(maxTime):
		return math.MaxInt64
	case t.Before(minTime):
		return math.MinInt64
	}
	return t.UnixNano()
}

var (
	maxTime = time.Unix(0, math.MaxInt64)
	minTime = time.Unix(0, math.MinInt64)
)

// CodecPanic is the answer to a delivery whose codec panicked in method
// (Name, Identity, Limits, Tuning, Size, Validate) given value v: permanent
// (codec.IsPermanent), wrapping codec.ErrCodecPanic.
func CodecPanic(method string, v any) error { return &codecPanic{method: method, value: v} }

// codecPanic is the answer to a message whose Size or Validate panicked:
// permanent, since the same message makes the codec panic again, and
// wrapping codec.ErrCodecPanic.
type codecPanic struct {
	method string
	value  any
}

func (e *codecPanic) Error() string {
	return fmt.Sprintf("%v in %s: %v", codec.ErrCodecPanic, e.method, e.value)
}
func (e *codecPanic) Unwrap() error          { return codec.ErrCodecPanic }
func (e *codecPanic) PermanentFailure() bool { return true }

// validate is the codec's Validate, if it has one, with a panic turned into
// the message's answer: one bad message must not restart the batcher and
// take every other caller's entry with it.
func (b *Batcher) validate(m codec.Message) (err error) {
	if b.validator == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: codec panicked in Validate", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = &codecPanic{method: "Validate", value: r}
		}
	}()
	return b.validator.Validate(m)
}

// size is the codec's Size, with a panic turned into the message's answer
// as in validate.
func (b *Batcher) size(m codec.Message) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: codec panicked in Size", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			n, err = 0, &codecPanic{method: "Size", value: r}
		}
	}()
	return b.p.Codec.Size(m), nil
}

// settle runs after every message: send what is due, expire what is late,
// publish the counters, report idleness or the end of a drain, and arm the
// timer for the next thing that will be due without a message.
func (b *Batcher) settle(ctx actor.Context) {
	for {
		f := b.takeDue()
		if f == nil {
			break
		}
		b.own++
		b.p.goroutines.Add(1)
		b.p.Requests.Add(1)
		go b.run(f)
	}
	if b.q.queued > 0 && b.now >= b.q.minDeadline {
		b.answerDropped(b.q.sweep(b.now, b.aliveFn))
	}
	if b.now >= b.inflightDeadline {
		b.expireInFlight()
	}
	b.publish()

	wake := b.q.wake()
	if b.inherited() && wake != 0 {
		// Nothing may go out yet (their ends wake the batcher), but
		// deadlines still pass.
		wake = 0
		if b.q.queued > 0 {
			wake = b.q.minDeadline
		}
	}
	if len(b.running) > 0 && b.inflightDeadline != math.MaxInt64 && (wake == 0 || b.inflightDeadline < wake) {
		wake = b.inflightDeadline
	}
	switch {
	case b.aborted:
		// Everything held was answered ErrStopped; requests still running
		// answer nobody. What matters is that every delivery on its way
		// here has arrived and been answered before the batcher stops.
		if !b.drainedSent && b.p.drain != nil && b.p.received == b.p.drain.Expect {
			b.drainedSent = true
			ctx.Send(ctx.Parent(), &Drained{Who: b.self})
		}
	case b.q.queued > 0 || b.q.inflight > 0 || b.inherited():
		b.idleSince, b.idleReported = 0, false
	case b.p.drain != nil:
		if !b.drainedSent && b.p.received == b.p.drain.Expect {
			b.drainedSent = true
			ctx.Send(ctx.Parent(), &Drained{Who: b.self})
		}
	case b.idleReported && b.p.received != b.idleReportedAt:
		// Deliveries that were answered without being queued (too large,
		// invalid, expired) raced the report, so the supervisor kept the
		// batcher: report again, at most once per IdleTimeout.
		if again := b.idleReportTime + int64(b.p.Tuning.IdleTimeout); b.now >= again {
			b.reportIdle(ctx)
		} else {
			wake = minWake(wake, again)
		}
	case !b.idleReported:
		if b.idleSince == 0 {
			b.idleSince = b.now
		}
		if b.now-b.idleSince >= int64(b.p.Tuning.IdleTimeout) {
			b.reportIdle(ctx)
		} else {
			wake = minWake(wake, b.idleSince+int64(b.p.Tuning.IdleTimeout))
		}
	}
	b.arm(wake)
}

// reportIdle tells the supervisor the batcher is idle, with the count of
// deliveries it has received: the supervisor stops it only if it forwarded
// exactly that many.
func (b *Batcher) reportIdle(ctx actor.Context) {
	b.idleReported, b.idleReportedAt, b.idleReportTime = true, b.p.received, b.now
	ctx.Send(ctx.Parent(), &Idle{Who: b.self, Received: b.p.received})
}

// minWake is the earlier of two wake times, 0 meaning none.
func minWake(a, b int64) int64 {
	if a == 0 {
		return b
	}
	return min(a, b)
}

// takeDue takes the batch that is due now, if any, and registers it as in
// flight. The queue counts slots: it never has more than MaxInflight
// batches out.
func (b *Batcher) takeDue() *inflight {
	if b.down || b.inherited() {
		return nil
	}
	trigger, ok := b.q.due(b.now)
	if !ok {
		return nil
	}
	batch, groups, dropped := b.q.take(b.now, b.aliveFn)
	var f *inflight
	if len(batch) > 0 {
		f = b.launch(batch, groups, trigger)
	}
	b.answerDropped(dropped)
	return f
}

// inherited reports whether request goroutines of an incarnation that
// crashed are still running. Their requests were cancelled, but a codec may
// take a while to notice; until they end this incarnation sends nothing,
// so that MaxInflight and each group's single request in flight hold
// across a restart. Each of them tells the batcher when it ends.
func (b *Batcher) inherited() bool {
	return b.p.goroutines.Load() > int64(b.own)
}

// launch registers a batch taken from the queue as in flight.
func (b *Batcher) launch(entries []*entry, groups []*lane, trigger telemetry.Trigger) *inflight {
	var deadline int64
	for _, e := range entries {
		deadline = max(deadline, e.deadline)
		b.inflightDeadline = min(b.inflightDeadline, e.deadline)
	}
	// No caller waits past the latest deadline, so neither does the request.
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, deadline))
	f := &inflight{entries: entries, groups: groups, ctx: ctx, cancel: cancel, trigger: trigger}
	b.running[f] = struct{}{}
	return f
}

// run is a request goroutine: it runs f, then the batches next hands it,
// and tells the batcher after each.
func (b *Batcher) run(f *inflight) {
	defer b.p.Requests.Done()
	var buf buffers
	for f != nil {
		report := b.request(f, &buf)
		// The callers are answered (in request), then the slot handed on,
		// then the batcher told.
		f = b.next(f)
		tell(b.system, b.self, theDone)
		b.flushed(report)
	}
}

// flushed reports a batch to the Recorder. A panic there is logged, not
// raised: on a request goroutine it would end the process.
func (b *Batcher) flushed(report telemetry.Flush) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: Recorder.Flushed panicked", slog.Any("panic", r))
		}
	}()
	b.p.Recorder.Flushed(report)
}

// next ends f's request and hands its slot to the batch due now, if any:
// it returns that batch, or nil when the goroutine should end. A panic in
// the batcher's code here would end the process, not the batcher: it is
// sent to Receive instead (see failed).
func (b *Batcher) next(f *inflight) (g *inflight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer func() {
		r := recover()
		if r != nil {
			g = nil
			b.down = true
		}
		if g == nil { // the goroutine ends
			b.own--
			b.p.goroutines.Add(-1)
		}
		if r != nil {
			tell(b.system, b.self, &failed{from: b, reason: r, stack: debug.Stack()})
		}
	}()
	delete(b.running, f)
	if b.down {
		return nil
	}
	b.q.complete(f.groups)
	b.now = time.Now().UnixNano()
	return b.takeDue()
}

// buffers are a request goroutine's slices, reused from one of its requests
// to the next (they were a twelfth of the bytes a Pub/Sub delivery
// allocates). SendBatch does not keep its batch (see codec.Codec).
type buffers struct {
	msgs    []codec.Message
	results []codec.Result
}

// request sends f's batch and answers each of its callers.
func (b *Batcher) request(f *inflight, buf *buffers) telemetry.Flush {
	defer f.cancel()
	n := len(f.entries)
	if cap(buf.msgs) < n {
		buf.msgs, buf.results = make([]codec.Message, n), make([]codec.Result, n)
	}
	msgs, results := buf.msgs[:n], buf.results[:n]
	// Let go of the payloads and ids: the goroutine may wait a while for
	// its next request, or end.
	defer clear(msgs)
	defer clear(results)
	report := telemetry.Flush{Trigger: f.trigger, Entries: n}
	for i, e := range f.entries {
		msgs[i] = e.deliver.Message
		report.Bytes += e.size
	}
	start := time.Now()
	report.Requests, _ = b.bisect(f.ctx, msgs, results)
	report.Bisections = report.Requests - 1
	report.Duration = time.Since(start)
	for i, e := range f.entries {
		if e.claimed.CompareAndSwap(false, true) {
			b.reply(e.sender, e.deliver, results[i])
		}
	}
	return report
}

// bisect sends msgs and writes one result per message into out. When the
// destination refuses the request for its content, it sends each half in
// turn, in order, until the refused messages stand alone. A half that fails
// for any other reason (throttling, a 5xx, a deadline) ends the bisection:
// the halves after it are not sent but answered with the same error, so that
// no entry overtakes an earlier one of its group that its caller will send
// again. It returns the number of requests it took and that failure, if any.
func (b *Batcher) bisect(ctx context.Context, msgs []codec.Message, out []codec.Result) (int, error) {
	res, err := b.send(ctx, msgs)
	switch {
	case err == nil:
		copy(out, res)
		return 1, nil
	case errors.Is(err, codec.ErrRefused) && len(msgs) > 1:
		h := len(msgs) / 2
		first, failed := b.bisect(ctx, msgs[:h], out[:h])
		if failed != nil {
			fill(out[h:], failed)
			return 1 + first, failed
		}
		if held := retryableGroups(msgs[:h], out[:h]); held != nil {
			second, failed := b.bisectHolding(ctx, msgs[h:], out[h:], held)
			return 1 + first + second, failed
		}
		second, failed := b.bisect(ctx, msgs[h:], out[h:])
		return 1 + first + second, failed
	case errors.Is(err, codec.ErrRefused):
		b.log.Warn("sinkbatch: the destination refused a message", slog.Any("error", err))
		fill(out, err)
		return 1, nil
	}
	fill(out, err)
	return 1, err
}

// errGroupHeld answers an entry of a bisected request that was not sent
// because an earlier entry of its group failed in an earlier half: sending
// it would store it before the earlier one, which its caller will retry.
var errGroupHeld = errors.New("sinkbatch: not sent: an earlier message of its group failed in the same request; deliver it again after that one")

// retryableGroups is the set of groups whose message in msgs failed with a
// retryable error (its caller will send it again), or nil.
func retryableGroups(msgs []codec.Message, out []codec.Result) map[string]struct{} {
	var held map[string]struct{}
	for i, r := range out {
		if r.Err != nil && msgs[i].Group != "" && !codec.IsPermanent(r.Err) {
			if held == nil {
				held = make(map[string]struct{})
			}
			held[msgs[i].Group] = struct{}{}
		}
	}
	return held
}

// bisectHolding is bisect for the messages of msgs whose group is not in
// held; the others are answered errGroupHeld and never sent.
func (b *Batcher) bisectHolding(ctx context.Context, msgs []codec.Message, out []codec.Result, held map[string]struct{}) (int, error) {
	var send []codec.Message
	var at []int
	for i, m := range msgs {
		if _, ok := held[m.Group]; ok && m.Group != "" {
			out[i] = codec.Result{Err: errGroupHeld}
			continue
		}
		send, at = append(send, m), append(at, i)
	}
	if len(send) == 0 {
		return 0, nil
	}
	res := make([]codec.Result, len(send))
	n, failed := b.bisect(ctx, send, res)
	for j, i := range at {
		out[i] = res[j]
	}
	return n, failed
}

func fill(out []codec.Result, err error) {
	for i := range out {
		out[i] = codec.Result{Err: err}
	}
}

// send makes one request, turning a panic or a result slice of the wrong
// length into an error for the whole request.
func (b *Batcher) send(ctx context.Context, msgs []codec.Message) (res []codec.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: codec panicked in SendBatch", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			res, err = nil, fmt.Errorf("%w: %v", codec.ErrCodecPanic, r)
		}
	}()
	res, err = b.p.Codec.SendBatch(ctx, msgs)
	if err == nil && len(res) != len(msgs) {
		return nil, fmt.Errorf("%w: %d results for %d messages", codec.ErrResultCount, len(res), len(msgs))
	}
	return res, err
}

// reply answers the sender of d with r: straight to its Listener if d names
// one (which drops the answer to a call that is over), else with a
// *messages.Delivered. A nil sender is nobody.
func (b *Batcher) reply(sender *actor.PID, d *messages.Deliver, r codec.Result) {
	if sender == nil {
		return
	}
	if l := listenerOf(d); l != nil {
		l.Answer(sender, r)
		return
	}
	tell(b.system, sender, &messages.Delivered{Ref: d.Ref, ID: r.ID, Sequence: r.Sequence, Err: r.Err})
}

// tell sends msg to pid if pid is still registered. A caller that gave up
// has left the registry; sending it the answer anyway would make protoactor
// log a dead letter for every late result. It costs the same lookup as a
// plain send.
func tell(system *actor.ActorSystem, pid *actor.PID, msg any) {
	if p, ok := system.ProcessRegistry.Get(pid); ok {
		p.SendUserMessage(pid, msg)
	}
}

// alive reports whether e's caller still waits: a Listener says so itself;
// a future that timed out or was stopped has left the process registry.
func (b *Batcher) alive(e *entry) bool {
	if e.sender == nil {
		return true
	}
	if l := listenerOf(e.deliver); l != nil {
		return l.Listening(e.sender)
	}
	p, ok := b.system.ProcessRegistry.Get(e.sender)
	if l, isListener := p.(Listener); ok && isListener {
		return l.Listening(e.sender)
	}
	return ok
}

// Listener is a reply process that serves many calls, told apart by the
// sender PID's RequestId (the front door's Deliver pools them). A batcher
// asks it whether a call still waits instead of relying on the process
// leaving the registry, and answers it directly, with no
// *messages.Delivered: Answer drops the answer to a call that is over. They
// are called from the batcher's actor and its request goroutines, often
// with its lock held: they must be quick, must not block or panic, and get
// a non-nil pid.
type Listener interface {
	Listening(pid *actor.PID) bool
	Answer(pid *actor.PID, r codec.Result)
}

// Direct, as a Deliver's Ref, names the sender's Listener, so that the
// batcher never looks the sender up in the process registry (the lookups,
// one in take and one in each reply, were a tenth of the CPU of a
// delivery). The front door sets it; Delivered.Ref echoes it.
type Direct struct{ Listener Listener }

// listenerOf is the Listener d names, if any.
func listenerOf(d *messages.Deliver) Listener {
	if r, ok := d.Ref.(*Direct); ok {
		return r.Listener
	}
	return nil
}

// answerDropped answers the entries the queue dropped: those whose deadline
// passed get errExpired (if their caller still listens: see tell); those
// whose caller is gone get nothing.
func (b *Batcher) answerDropped(dropped []*entry) {
	for _, e := range dropped {
		if e.deadline <= b.now {
			b.reply(e.sender, e.deliver, codec.Result{Err: errExpired})
		}
	}
}

// expireInFlight answers the callers whose deadline has passed while their
// entry is in a request: a caller is never answered later than its deadline,
// though the request cannot be recalled (the message may be stored; a retry
// with the same idempotency key is safe). It costs O(entries in flight) and
// runs only when the earliest such deadline has passed.
func (b *Batcher) expireInFlight() {
	next := int64(math.MaxInt64)
	for f := range b.running {
		for _, e := range f.entries {
			if e.claimed.Load() {
				continue
			}
			if e.deadline <= b.now {
				if e.claimed.CompareAndSwap(false, true) {
					b.reply(e.sender, e.deliver, codec.Result{Err: errExpiredInFlight})
				}
				continue
			}
			next = min(next, e.deadline)
		}
	}
	b.inflightDeadline = next
}

// answerAll answers every caller the batcher holds with err: the delivery
// being handled, every queued entry, and every request in flight, whose late
// result is then ignored.
func (b *Batcher) answerAll(err error) {
	if b.q == nil {
		return
	}
	if b.current != nil {
		b.reply(b.currentSender, b.current, codec.Result{Err: err})
		b.current = nil
	}
	for _, e := range b.q.drainAll() {
		b.reply(e.sender, e.deliver, codec.Result{Err: err})
	}
	for f := range b.running {
		for _, e := range f.entries {
			if e.claimed.CompareAndSwap(false, true) {
				b.reply(e.sender, e.deliver, codec.Result{Err: err})
			}
		}
		f.cancel()
	}
}

func (b *Batcher) arm(wake int64) {
	if wake == 0 || (b.armed != 0 && b.armed <= wake) {
		return
	}
	d := time.Duration(max(wake-b.now, 0))
	if b.timer == nil {
		b.timer = time.AfterFunc(d, b.fire)
	} else {
		b.timer.Reset(d)
	}
	b.armed = wake
}

func (b *Batcher) fire() { tell(b.system, b.self, b.tickMsg) }

func (b *Batcher) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// publish adds the changes since the last message to the instance's counters.
func (b *Batcher) publish() {
	c := b.p.Counters
	if d := b.q.queued - b.published.queued; d != 0 {
		c.Queued.Add(int64(d))
		b.published.queued = b.q.queued
	}
	if d := b.q.queuedBytes - b.published.bytes; d != 0 {
		c.QueuedBytes.Add(d)
		b.published.bytes = b.q.queuedBytes
	}
	if d := b.q.inflight - b.published.inflight; d != 0 {
		c.InFlight.Add(int64(d))
		b.published.inflight = b.q.inflight
	}
}

// unpublish takes this incarnation's share out of the counters when it ends.
func (b *Batcher) unpublish() {
	c := b.p.Counters
	c.Queued.Add(-int64(b.published.queued))
	c.QueuedBytes.Add(-b.published.bytes)
	c.InFlight.Add(-int64(b.published.inflight))
	b.published.queued, b.published.bytes, b.published.inflight = 0, 0, 0
}
