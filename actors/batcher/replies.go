package batcher

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file is how a batcher answers its callers: straight to a Listener the
// Deliver names (the front door's Deliver), or with a *messages.Delivered to
// the sender PID (an actor's ctx.Request, a future).

// caller is who an entry's answer goes to: the delivery and its sender.
type caller struct {
	deliver *messages.Deliver
	sender  *actor.PID // nil: nobody is answered
	span    trace.Span // the delivery's create span; nil when the instance does not trace
	// callerEnds: span is the front door caller's to end (Direct.Span),
	// not the batcher's.
	callerEnds bool
}

// Listener is a reply process that serves many calls, told apart by the
// sender PID's RequestId (the front door's Deliver pools them). A batcher
// asks it whether a call still waits instead of relying on the process
// leaving the registry, and answers it directly, with no
// *messages.Delivered: Answer drops the answer to a call that is over. They
// are called from the batcher's actor and its request goroutines, never
// with the batcher's lock held (they may call back into the instance):
// they must be quick, must not block or panic, and get a non-nil pid.
// Listening is asked as a delivery arrives and again just before its
// request is sent: a call that stopped listening by then is not sent. To
// free the room its entry holds at once, a caller that gives up also calls
// its Room's Leave.
type Listener interface {
	Listening(pid *actor.PID) bool
	Answer(pid *actor.PID, r codec.Result)
}

// Forgetter is a Listener told when a batcher lets go of a call that
// stopped listening without answering it: its entry was dropped before it
// was sent (Listening said no), and nothing will be sent or answered for
// it. Like a Listener's, Forgotten is called from the batcher's actor or
// its request goroutines, must be quick and must not block or panic. An entry is either answered or
// forgotten, never both; an entry that left in a request is answered.
type Forgetter interface {
	Forgotten(pid *actor.PID)
}

// forget tells c's Listener, if it is a Forgetter, that c was dropped
// unanswered.
func forget(c caller) {
	if c.sender == nil {
		return
	}
	if f, ok := listenerOf(c.deliver).(Forgetter); ok {
		f.Forgotten(c.sender)
	}
}

// Direct, as a Deliver's Ref, names the sender's Listener, so that the
// batcher answers it and asks whether it listens without a process
// registry lookup. The front door sets it; Delivered.Ref echoes it.
type Direct struct {
	Listener Listener
	// Sender is who is answered when the Deliver arrives without an
	// envelope (the front door sends it so): the PID handed to Listener.
	Sender *actor.PID
	// Span is the delivery's create span, which the caller started
	// (StartCreate) and ends when answered; nil: the batcher starts one
	// if the instance traces.
	Span trace.Span
	// Room, if set, is where the batcher that admits the Deliver keeps its
	// entry, so that the front door allocates a call's record and its entry
	// at once. Nil: the batcher allocates the entry.
	Room *Room
}

// Room is memory for one delivery's entry, allocated with the call that
// sends it. Only the first batcher to admit a Deliver naming it takes it
// (the Deliver is sent once, but a Deliver copied or sent again must not
// share an entry); any later one allocates its own.
type Room struct {
	taken atomic.Bool
	left  atomic.Bool // Leave was called
	owner Owner       // told when the batcher that took the Room lets go of it; nil: nobody
	e     entry
}

// Leave is the caller's word that it gave up on the delivery whose Room r
// is (its context ended): the batcher that holds its entry drops it unsent,
// and frees its room, when it next looks at the queue (Params.CallerLeft
// makes that at once while deliveries wait for room). The caller calls it
// while it still holds r (before letting go of the memory r shares with its
// call record); a Leave after the entry was sent changes nothing.
func (r *Room) Leave() { r.left.Store(true) }

// Owner is told when a batcher lets go of a Room, so that the memory the
// Room shares with its Deliver, Direct and Sender (the front door's call
// record) can serve another call once its caller has let go too.
//
// The batcher that took the Room calls Release at most once, after its last
// touch of the Room, of the Deliver naming it and of what that Deliver's
// Direct names. It calls it only for an entry it sent and answered itself
// from its request's result; an entry dropped, refused, answered by the
// actor (expired in flight, restart, abort, stop) or that ever waited for
// room (WhenFull Block, whose list lets go of its entries lazily) is never
// released: its memory is left to the collector. A Room with an Owner must
// name a Deliver that is sent once and never copied: a copy's entry is not
// the Room's, and would answer through a Direct already handed on.
type Owner interface {
	Release()
}

// SetOwner makes o the Owner of r, which no batcher has taken yet.
func (r *Room) SetOwner(o Owner) { r.owner = o }

// entryFor is where d's entry goes: the Room its Direct names, if this is
// the first claim on it, else a new entry.
func entryFor(d *messages.Deliver) (e *entry, left *atomic.Bool) {
	if r, ok := d.Ref.(*Direct); ok && r.Room != nil && r.Room.taken.CompareAndSwap(false, true) {
		return &r.Room.e, &r.Room.left
	}
	return new(entry), nil
}

// release tells the Owner of e's Room, if e is that Room's entry and never
// waited for room, that the batcher has let go of it (see Owner). Only a
// request goroutine calls it, for an entry whose claim it won, after
// answering it: the entry has left the queue's lanes (pop clears its
// slot), its batch has left the running set (finishWith), so neither the
// actor nor another goroutine reaches it again.
func release(e *entry) {
	if e.waited {
		return
	}
	if r, ok := e.to.deliver.Ref.(*Direct); ok && r.Room != nil && r.Room.owner != nil && &r.Room.e == e {
		r.Room.owner.Release()
	}
}

// SenderOf is who a Deliver is answered to: the sender of its envelope, or,
// without one, the Sender its Direct names; nil: nobody.
func SenderOf(envelope *actor.PID, d *messages.Deliver) *actor.PID {
	if envelope != nil {
		return envelope
	}
	if r, ok := d.Ref.(*Direct); ok {
		return r.Sender
	}
	return nil
}

// listenerOf is the Listener d names, if any.
func listenerOf(d *messages.Deliver) Listener {
	if r, ok := d.Ref.(*Direct); ok {
		return r.Listener
	}
	return nil
}

// reply answers c with r: straight to its Listener if its Deliver names one
// (which drops the answer to a call that is over), else with a
// *messages.Delivered. A nil sender is nobody.
func (b *Batcher) reply(c caller, r codec.Result) {
	if b.deliveries != nil {
		b.answered(r.Err)
	}
	if c.span != nil && !c.callerEnds {
		b.tracing.endCreate(c.span, r)
	}
	if c.sender == nil {
		return
	}
	if l := listenerOf(c.deliver); l != nil {
		l.Answer(c.sender, r)
		return
	}
	tell(b.system, c.sender, &messages.Delivered{Ref: c.deliver.Ref, ID: r.ID, Sequence: r.Sequence, Err: r.Err})
}

// answered counts an answer by its outcome. A panic in the Recorder is
// logged, not raised: this runs on request goroutines too.
func (b *Batcher) answered(err error) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: Recorder.Answered panicked", slog.Any("panic", r))
		}
	}()
	b.deliveries.Answered(outcomeOf(err))
}

// outcomeOf classifies an answer for the deliveries counter.
func outcomeOf(err error) telemetry.Outcome {
	var full *messages.RetryAfterError
	switch {
	case err == nil:
		return telemetry.OutcomeOK
	case err == messages.ErrStopped:
		return telemetry.OutcomeStopped
	case err == messages.ErrBatcherDown:
		return telemetry.OutcomeDown
	case errors.As(err, &full):
		return telemetry.OutcomeRefused
	case errors.Is(err, context.DeadlineExceeded):
		return telemetry.OutcomeDeadline
	case codec.IsPermanent(err):
		return telemetry.OutcomePermanent
	}
	return telemetry.OutcomeRetryable
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
	c := e.to
	if c.sender == nil {
		return true
	}
	if l := listenerOf(c.deliver); l != nil {
		return l.Listening(c.sender)
	}
	p, ok := b.system.ProcessRegistry.Get(c.sender)
	if l, isListener := p.(Listener); ok && isListener {
		return l.Listening(c.sender)
	}
	return ok
}

// silentGone returns the entries of es whose callers are gone (alive
// false), es reused. It runs on the actor, outside the rules' lock: es
// holds no Room's entry (those hear Room.Leave), so no entry of es serves
// another delivery meanwhile.
func (b *Batcher) silentGone(es []*entry) []*entry {
	gone := es[:0]
	for _, e := range es {
		if !b.alive(e) {
			gone = append(gone, e)
		}
	}
	return gone
}

// sweep sweeps the queue and the waiting list (dispatch.sweepGone) and
// answers what that drops. The callers that can say nothing of their
// leaving (an actor's future) are asked about first, here on the actor and
// outside the rules' lock, so that a waiter among them whose caller left
// passes its turn and its room on.
func (b *Batcher) sweep() {
	var gone []*entry
	if es := b.d.silent(); len(es) > 0 {
		gone = b.silentGone(es)
	}
	b.answerDropped(b.d.sweepGone(b.now, gone), b.now)
}

// answerDropped answers the entries the queue dropped at now: those its
// group held back for a retry (pause.go) get GroupPausedError; those whose
// deadline passed get errExpired (if their caller still listens: see
// tell); those whose caller is gone get nothing (a Forgetter is told).
func (b *Batcher) answerDropped(dropped []*entry, now int64) {
	for _, e := range dropped {
		if e.heldBy != "" {
			b.reply(e.to, codec.Result{Err: b.groupPaused(e.msg.Group, e.heldBy)})
			continue
		}
		if e.deadline <= now {
			b.reply(e.to, codec.Result{Err: errExpired})
			continue
		}
		if e.to.span != nil && !e.to.callerEnds {
			b.tracing.abandonCreate(e.to.span)
		}
		forget(e.to)
	}
}

// answerEach answers each of entries with err.
func (b *Batcher) answerEach(entries []*entry, err error) {
	for _, e := range entries {
		b.reply(e.to, codec.Result{Err: err})
	}
}
