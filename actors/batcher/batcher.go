package batcher

import (
	"context"
	"fmt"
	"github.com/ankusa/sinkbatch/internal/mono"
	"log/slog"
	"math"
	"runtime/debug"
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

// Abort tells a draining batcher that Stop's context ended: answer
// everything it holds with ErrStopped now, answer every delivery still on
// its way the same, and report Drained once the last has arrived.
type Abort struct{}

// tick wakes the batcher when linger, a deadline or its idle timeout runs out.
type tick struct{}

// done tells the batcher that a request has ended, so that it looks at
// what that changed: a slot may be free, the queue idle, a drain over.
type done struct{}

// theDone is the one done message; it carries nothing.
var theDone = &done{}

// left tells the batcher that a caller gave up while deliveries wait for
// room (Params.CallerLeft): the room its entry held is theirs now.
type left struct{}

// theLeft is the one left message.
var theLeft = &left{}

// GetPriority puts left messages first in the mailbox: the waiters it
// admits must not wait behind deliveries.
func (*left) GetPriority() int8 { return priorityFirst }

// goroutinePanic carries a panic of the rules on a request goroutine (see
// dispatch.finish) to Receive, which panics with it so that the supervisor
// restarts the batcher, as it does for a panic in Receive.
type goroutinePanic struct {
	from   *dispatch // the incarnation whose goroutine failed
	reason any
	stack  []byte
}

// Mailbox priorities (protoactor's default is 4).
const (
	priorityFirst = 7
	priorityTick  = 6
)

// GetPriority puts done messages first in the mailbox.
func (*done) GetPriority() int8 { return priorityFirst }

// GetPriority puts Abort first in the mailbox: the deliveries queued behind
// it are then answered ErrStopped at once instead of being admitted, so
// Stop's short grace covers a mailbox of any length.
func (*Abort) GetPriority() int8 { return priorityFirst }

// GetPriority puts goroutinePanic first in the mailbox.
func (*goroutinePanic) GetPriority() int8 { return priorityFirst }

// GetPriority puts ticks before deliveries.
func (*tick) GetPriority() int8 { return priorityTick }

var (
	errExpired         = fmt.Errorf("sinkbatch: the deadline passed before the message was sent: %w", context.DeadlineExceeded)
	errExpiredInFlight = fmt.Errorf("sinkbatch: the deadline passed while the message's request was in flight; it may have been stored: %w", context.DeadlineExceeded)
)

// fullSweepEvery bounds how often a full queue is swept for callers that
// gave up without a cancel the batcher can see (an actor's future that timed
// out): a sweep costs O(queue).
const fullSweepEvery = 10 * time.Millisecond

// Props returns the props of a batcher for p's destination. Its mailbox
// lets done messages and ticks pass the deliveries waiting in it: they start
// requests for slots that no request goroutine took on, report idleness and
// end a drain, none of which should queue behind a burst of deliveries.
//
// Each incarnation reads the depth of that one mailbox (it outlives
// restarts), to run advance once per run of deliveries instead of once each.
// The mailbox runs on the batcher's own goroutine (see mailboxRef.Schedule).
func Props(p *Params) *actor.Props {
	box := newMailboxRef()
	return actor.PropsFromProducer(func() actor.Actor { return &Batcher{p: p, box: box} },
		actor.WithMailbox(func() actor.Mailbox {
			// protoactor produces the actor, then its mailbox, on the
			// spawning goroutine, before the first message is posted.
			box.m = actor.UnboundedPriorityMpsc()()
			return box.m
		}),
		actor.WithDispatcher(box))
}

// maxDeferred bounds the deliveries handled in a row without advance: a
// mailbox that never empties still sees its timer re-armed, its counters
// published and its expired entries answered that often.
const maxDeferred = 32

// Batcher is the actor that owns one destination's queue. It admits
// deliveries, decides when a batch goes out, starts a request goroutine for
// each slot no goroutine took on, and answers every caller exactly once.
//
// What it shares with its request goroutines is in d, behind d's lock. The
// fields set in Started are read by the goroutines too and never change;
// every other field is touched by the actor alone.
type Batcher struct {
	p   *Params
	d   *dispatch
	box *mailboxRef // nil in tests that drive a Batcher without an actor

	// Set in Started, never changed.
	system    *actor.ActorSystem
	self      *actor.PID
	log       *slog.Logger
	validator codec.Validator
	tickMsg   *tick
	// deliveries is the Recorder's DeliveryRecorder, if it has one.
	deliveries telemetry.DeliveryRecorder
	tracing    *tracing // nil: the instance does not trace

	// Touched by the actor alone.
	now            int64 // when the message being handled arrived (internal/mono)
	timer          *time.Timer
	armed          int64
	idleSince      int64
	idleReported   bool
	idleReportedAt uint64 // the Received count of the last Idle
	idleReportTime int64
	drainedSent    bool
	deferred       int    // deliveries handled since the last advance
	cancelsSeen    uint64 // Params.Cancels at the last sweep for room
	lastFullSweep  int64
	// The delivery being handled, until it is queued or answered: a panic
	// in between leaves it here for Restarting to answer.
	current caller
	// launched is step's buffer, reused from message to message.
	launched  []*inflight
	published struct {
		queued, inflight, waiting int
		bytes                     int64
	}
}

// Receive handles one message. It never waits on a request: requests run on
// their own goroutines. If it panics, this incarnation is down at once:
// nothing more is taken from its queue, which may be half changed, and
// until the restart a delivery is answered ErrBatcherDown.
func (b *Batcher) Receive(ctx actor.Context) {
	finished := false
	defer func() {
		if !finished && b.d != nil {
			b.d.markDown()
		}
	}()
	b.receive(ctx)
	finished = true
}

func (b *Batcher) receive(ctx actor.Context) {
	b.now = mono.Now()
	switch m := ctx.Message().(type) {
	case *messages.Deliver:
		quiet := b.deliver(caller{deliver: m, sender: SenderOf(ctx.Sender(), m)})
		// A delivery queued with no batch due changes nothing advance
		// would act on now but the counters and the timer: while more
		// messages wait, the last of them runs it (see maxDeferred).
		if quiet && b.deferred < maxDeferred && b.box.pending() {
			b.deferred++
			return
		}
	case *Adopt:
		// Forwarded by the router as deliveries are, and counted as they
		// are (idle stops and drains compare the counts).
		b.p.received++
		b.d.adoptPauses(m.Groups, b.now)
		for _, g := range m.Groups {
			b.log.Info("sinkbatch: group paused by a hand-over", slog.String("group", g.Group), slog.Duration("left", g.Left))
		}
		if m.Done != nil {
			m.Done <- nil
		}
	case *done:
	case *left:
		b.sweep()
	case *tick:
		b.armed = 0
	case *Drain:
		b.p.drain = m
		b.answerEach(b.d.setDraining(), messages.ErrStopped)
	case *Abort:
		b.p.aborted = true
		b.answerEach(b.d.setDraining(), messages.ErrStopped)
		b.answerAll(messages.ErrStopped)
	case *goroutinePanic:
		if m.from == b.d {
			panic(fmt.Sprintf("%v (on a request goroutine)\n%s", m.reason, m.stack))
		}
	case *actor.Started:
		b.start(ctx)
	case *actor.Restarting:
		b.end(messages.ErrBatcherDown)
		return
	case *actor.Stopping:
		b.end(messages.ErrStopped)
		return
	case *actor.Stopped:
		b.box.close()
		return
	default:
		if b.deferred == 0 {
			return
		}
		// The advance a delivery left to this message.
	}
	b.advance(ctx)
}

func (b *Batcher) start(ctx actor.Context) {
	b.system = ctx.ActorSystem()
	b.self = ctx.Self()
	b.log = b.p.Logger
	b.validator, _ = b.p.Codec.(codec.Validator)
	b.deliveries, _ = b.p.Recorder.(telemetry.DeliveryRecorder)
	if b.p.Tracer != nil {
		b.tracing = newTracing(b.p.Tracer, b.p.Codec, b.p.Sink, b.log)
	}
	b.tickMsg = &tick{}
	q := newQueue(settingsOf(b.p.Tuning, b.p.OneGroup))
	q.draining = b.p.drain != nil // a restart does not end Stop's drain
	b.d = newDispatch(q, &b.p.goroutines)
	b.d.stretch, b.d.instance = newStretch(int64(b.p.Tuning.Linger), b.p.Tuning.MaxInflight), &b.p.Counters.InFlight
	b.startFlow()
	b.p.incarnations++
	if b.p.incarnations == 1 {
		b.log.Info("sinkbatch: batcher started")
	}
}

// end answers everything the incarnation holds with err as it restarts or
// stops; its request goroutines take nothing more.
func (b *Batcher) end(err error) {
	if b.d == nil {
		return
	}
	b.d.markDown()
	b.deferred = 0
	b.answerAll(err)
	b.endFlow(err)
	if b.timer != nil {
		b.timer.Stop()
	}
	b.unpublish()
}

// deliver admits one delivery or answers it at once: expired, invalid,
// too large, refused for fullness, or the incarnation is down. It reports
// whether the delivery was queued and left no batch due, and nothing else
// happened: advance then has nothing to do at once.
func (b *Batcher) deliver(c caller) (quiet bool) {
	b.p.received++
	if b.p.aborted {
		// Stop's context ended: what was still on its way is answered, not
		// queued.
		b.reply(c, codec.Result{Err: messages.ErrStopped})
		return false
	}
	d := c.deliver
	if l := listenerOf(d); l != nil && c.sender != nil && !l.Listening(c.sender) {
		// Its caller gave up while the delivery was on its way: it must
		// not hold room. (A Listener answers at once; asking the process
		// registry about every other sender would cost each delivery a
		// lookup, so those are found by the sweeps.)
		forget(c)
		return false
	}
	// c stays current until it is queued or answered: if a panic comes in
	// between (the Recorder is user code), the restart answers it.
	b.current = c
	msg := &d.Message
	if b.tracing != nil {
		// The message carries the create span's context to its consumer;
		// Validate and Size see it as it will be sent. The front door's
		// Deliver (it names a Listener) is the batcher's to change; an
		// actor's is not, so its message is copied.
		var tc codec.TraceContext
		if r, ok := d.Ref.(*Direct); ok && r.Span != nil {
			// The caller started it and set the message's context.
			c.span, c.callerEnds = r.Span, true
			b.current = c
			b.tracing.admitCreate(c.span)
		} else if c.span, tc = b.tracing.startCreate(d.SpanContext); c.span != nil {
			b.current = c
			if tc != (codec.TraceContext{}) {
				if listenerOf(d) == nil {
					m := d.Message
					msg = &m
				}
				msg.Trace = tc
			}
		}
	}
	deadline := mono.AddSat(b.now, int64(b.p.DefaultTimeout))
	if !d.Deadline.IsZero() {
		deadline = mono.Instant(d.Deadline)
	}
	var err error
	if deadline <= b.now {
		err = errExpired
	} else {
		err = b.validate(*msg)
	}
	size := 0
	if err == nil {
		size, err = b.size(*msg)
	}
	if err == nil && size > b.p.Tuning.MaxBytes {
		err = fmt.Errorf("%w: %d bytes, one request takes at most %d", codec.ErrTooLarge, size, b.p.Tuning.MaxBytes)
	}
	if err == nil && b.p.Tuning.StrictGroups && msg.Group != "" && msg.IdempotencyKey == "" {
		err = messages.ErrNoIdempotencyKey
	}
	if err != nil {
		b.current = caller{}
		b.reply(c, codec.Result{Err: err})
		return false
	}
	e, left := entryFor(d)
	*e = entry{msg: msg, to: c, size: int32(max(size, 0)), deadline: deadline, admitted: b.now, left: left}
	// Room held by callers that gave up is not room: look for them when one
	// may have (a deadline passed, a Deliver caller cancelled), and at most
	// every fullSweepEvery otherwise, for the actor callers that stopped
	// waiting without a word.
	cancels := b.p.Cancels.Load()
	a := b.d.admit(e, b.now, cancels != b.cancelsSeen || b.now-b.lastFullSweep >= int64(fullSweepEvery))
	if a.ask != nil {
		// Callers that can say nothing (an actor's future) are asked
		// about here, outside the rules' lock.
		a = b.d.admitSwept(e, b.now, a, b.silentGone(a.ask))
	}
	if a.ok || a.waiting {
		// Queued: a request goroutine may send, answer and release it
		// (see Owner) from now on, so nothing here may reach it again.
		b.current = caller{}
	}
	if a.swept {
		b.cancelsSeen, b.lastFullSweep = cancels, b.now
		b.answerDropped(a.dropped, b.now)
	}
	if a.resumed != "" {
		b.logResumed("retry", a.resumed)
	}
	for _, g := range a.pausedRefused {
		b.log.Info("sinkbatch: group paused after a refusal", slog.String("group", g))
	}
	switch {
	case a.ok, a.waiting:
	case a.paused:
		b.current = caller{}
		b.reply(c, codec.Result{Err: b.groupPaused(msg.Group, a.waitFor)})
	case a.stopped:
		b.current = caller{}
		b.reply(c, codec.Result{Err: messages.ErrStopped})
	case a.down:
		// A request goroutine failed; the restart is on its way.
		b.current = caller{}
		b.reply(c, codec.Result{Err: messages.ErrBatcherDown})
	default:
		err := b.retryAfter(a.reason)
		b.p.Recorder.Refused(a.reason)
		b.current = caller{}
		b.reply(c, codec.Result{Err: err})
	}
	if a.evicted != nil {
		// After c is settled: a panic in the Recorder must not leave c
		// both current and queued.
		b.reply(a.evicted.to, codec.Result{Err: b.retryAfter(messages.FullEntries)})
		b.p.Recorder.Refused(messages.FullEntries)
	}
	if !a.swept && len(a.dropped) > 0 {
		// Entries its admission held back for a retry (pause.go).
		b.answerDropped(a.dropped, b.now)
	}
	return a.ok && !a.due && !a.swept && a.resumed == "" && a.evicted == nil && len(a.dropped) == 0
}

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
	err = b.validator.Validate(m)
	if why := unreadable(err); why != "" {
		// Nobody could read the answer.
		return &codecPanic{method: "Validate", value: "the error it returned " + why}
	}
	return err
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

// advance runs after every message: start a request for each batch due
// that no request goroutine took on, answer what expired, publish the
// counters, report idleness or the end of a drain, and arm the timer for
// the next thing that will be due without a message.
func (b *Batcher) advance(ctx actor.Context) {
	b.deferred = 0
	launched, dropped, st := b.d.step(b.now, b.launched[:0])
	// The goroutines first: they are counted already, and answering the
	// dropped entries calls the callers' code, which may panic.
	for i, f := range launched {
		b.p.Requests.Add(1)
		go b.run(f)
		launched[i] = nil
	}
	b.launched = launched
	b.answerDropped(dropped, b.now)
	if st.sweepDue {
		b.sweep()
	}
	if st.expireDue {
		late, held := b.d.expire(b.now)
		b.answerEach(late, errExpiredInFlight)
		b.answerDropped(held, b.now)
	}
	if st.pausesDue {
		b.logResumed("GroupPauseMax", b.d.expirePauses(b.now)...)
	}
	if st.sweepDue || st.expireDue || st.pausesDue {
		st = b.d.status(b.now)
	}
	b.publish(st)
	if b.box != nil {
		b.box.held.Store(st.held)
	}

	// A request goroutine changes what st says only by ending a request or
	// taking one, and then it sends done: a stale st is corrected by the
	// message that follows.
	wake := st.wake
	switch {
	case b.p.aborted:
		// Everything held was answered ErrStopped; requests still running
		// answer nobody. What matters is that every delivery on its way
		// has arrived, and been answered, before the batcher stops.
		b.reportDrained(ctx)
	case st.held:
		b.idleSince, b.idleReported = 0, false
	case b.p.drain != nil:
		b.reportDrained(ctx)
	case st.paused:
		b.idleSince, b.idleReported = 0, false
	case b.idleReported && b.p.received != b.idleReportedAt:
		// Deliveries answered without being queued (too large, invalid,
		// expired) raced the report, so the supervisor kept the batcher:
		// report again, at most once per IdleTimeout.
		if again := mono.AddSat(b.idleReportTime, int64(b.p.Tuning.IdleTimeout)); b.now >= again {
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
			wake = minWake(wake, mono.AddSat(b.idleSince, int64(b.p.Tuning.IdleTimeout)))
		}
	}
	b.arm(wake)
}

// reportDrained tells the supervisor, once, that every delivery Stop's
// drain expects has been received and answered.
func (b *Batcher) reportDrained(ctx actor.Context) {
	if !b.drainedSent && b.p.drain != nil && b.p.received == b.p.drain.Expect {
		b.drainedSent = true
		ctx.Send(ctx.Parent(), &Drained{Who: b.self})
	}
}

// reportIdle tells the supervisor the batcher is idle, with the count of
// deliveries it has received: the supervisor stops it only if it forwarded
// exactly that many.
func (b *Batcher) reportIdle(ctx actor.Context) {
	b.idleReported, b.idleReportedAt, b.idleReportTime = true, b.p.received, b.now
	ctx.Send(ctx.Parent(), &Idle{Who: b.self, Received: b.p.received})
}

// answerAll answers every caller the incarnation holds with err: the
// delivery being handled, every queued or waiting entry, and every entry in
// a request, whose late result is then ignored. On a restart
// (ErrBatcherDown, which callers retry) their groups pause (pause.go).
func (b *Batcher) answerAll(err error) {
	pause := err == messages.ErrBatcherDown && b.p.Tuning.StrictGroups
	var extra []*entry
	c := b.current
	if c.deliver != nil && pause && c.deliver.Message.Group != "" {
		extra = append(extra, &entry{msg: &c.deliver.Message})
	}
	all := b.d.abandon(b.now, pause, extra...)
	if c.deliver != nil {
		b.reply(c, codec.Result{Err: err})
		b.current = caller{}
	}
	b.answerEach(all, err)
}

func (b *Batcher) arm(wake int64) {
	if wake == 0 || wake == math.MaxInt64 || (b.armed != 0 && b.armed <= wake) {
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

func (b *Batcher) fire() { b.box.tellPrompt(b.system, b.self, b.tickMsg) }

// publish adds the changes since the last message to the instance's counters.
func (b *Batcher) publish(st status) {
	c := b.p.Counters
	if d := st.queued - b.published.queued; d != 0 {
		c.Queued.Add(int64(d))
		b.published.queued = st.queued
	}
	if d := st.queuedBytes - b.published.bytes; d != 0 {
		c.QueuedBytes.Add(d)
		b.published.bytes = st.queuedBytes
	}
	if d := st.inflight - b.published.inflight; d != 0 {
		c.InFlight.Add(int64(d))
		b.published.inflight = st.inflight
	}
	if d := st.waiting - b.published.waiting; d != 0 {
		c.Waiting.Add(int64(d))
		b.published.waiting = st.waiting
		b.p.waiting.Store(int64(st.waiting))
	}
}

// unpublish takes this incarnation's share out of the counters when it ends.
func (b *Batcher) unpublish() {
	c := b.p.Counters
	c.Queued.Add(-int64(b.published.queued))
	c.QueuedBytes.Add(-b.published.bytes)
	c.InFlight.Add(-int64(b.published.inflight))
	c.Waiting.Add(-int64(b.published.waiting))
	b.p.waiting.Store(0)
	b.published.queued, b.published.bytes, b.published.inflight, b.published.waiting = 0, 0, 0, 0
}
