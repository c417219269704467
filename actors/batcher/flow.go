package batcher

import (
	"context"
	"errors"
	"github.com/ankusa/sinkbatch/internal/mono"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file joins the flow rules (pause.go, block.go, adaptive.go) to the
// actor and its request goroutines.

// learn is what a request's results tell the rules: its time, whether the
// destination pushed back, and each entry's result (StrictGroups: see
// finishWith).
func (b *Batcher) learn(results []codec.Result, failed error, rtt time.Duration) outcome {
	o := outcome{rtt: int64(rtt), ok: failed == nil, results: results}
	o.pressured = codec.IsThrottled(failed) || errors.Is(failed, context.DeadlineExceeded)
	for _, r := range results {
		if r.Err != nil && codec.IsThrottled(r.Err) {
			o.pressured = true
			break
		}
	}
	return o
}

// settle does what finishWith asks of the request goroutine: answer the
// entries of groups that paused, and log the pauses and a new in-flight
// limit.
func (b *Batcher) settle(r finished, now int64) {
	b.answerDropped(r.held, now)
	for _, g := range r.paused {
		b.log.Info("sinkbatch: group paused after a retryable failure",
			slog.String("group", g), slog.Duration("max", b.p.Tuning.GroupPauseMax))
	}
	if r.limit != 0 {
		b.log.Debug("sinkbatch: in-flight limit changed", slog.Int("limit", r.limit))
		b.recordLimit(r.limit)
	}
}

// groupPaused is the answer to a delivery of group g, paused and waiting
// for the retry keyed key: with a suggested wait drawn, as a refusal's is,
// from (0, RetryAfterMax], so that held callers do not spin.
func (b *Batcher) groupPaused(g, key string) *messages.GroupPausedError {
	return &messages.GroupPausedError{Group: g, Key: key, After: b.retryWait()}
}

// logResumed logs groups that resumed, and why.
func (b *Batcher) logResumed(why string, groups ...string) {
	for _, g := range groups {
		b.log.Info("sinkbatch: group resumed", slog.String("group", g), slog.String("by", why))
	}
}

// recordLimit reports the adaptive in-flight limit to the Recorder, if it
// takes it (telemetry.LimitRecorder); 0 says the destination is gone. A
// panic there is logged, not raised, as in flushed.
func (b *Batcher) recordLimit(limit int) {
	lr, ok := b.p.Recorder.(telemetry.LimitRecorder)
	if !ok {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: Recorder.InflightLimit panicked", slog.Any("panic", r))
		}
	}()
	lr.InflightLimit(b.p.Name, limit)
}

// ResumeGroup resumes group g of p's destination if it is paused
// (StrictGroups) and reports whether it was. Safe for concurrent use: it
// goes straight to the running incarnation's rules, under their lock, not
// through the mailbox, which protoactor empties without a word when the
// batcher stops.
func (p *Params) ResumeGroup(g string) bool {
	for {
		in := p.current.Load()
		if in == nil {
			return false
		}
		resumed, ok := in.d.resumeGroupIf(g, func() bool { return p.current.Load() == in })
		if !ok {
			continue // in handed its pauses to the next incarnation meanwhile
		}
		if !resumed {
			return false
		}
		// The actor looks again: with no group paused it may now stop idle.
		in.wake()
		p.Logger.Info("sinkbatch: group resumed", slog.String("group", g), slog.String("by", "ResumeGroup"))
		return true
	}
}

// TakePauses removes the paused groups of p's destination and returns
// them, each with the time its pause has left, for another instance to
// adopt (Adopt). Safe for concurrent use, as ResumeGroup.
func (p *Params) TakePauses() []messages.PausedGroup {
	for {
		in := p.current.Load()
		if in == nil {
			return nil
		}
		taken, ok := in.d.takePausesIf(mono.Now(), func() bool { return p.current.Load() == in })
		if !ok {
			continue // in handed its pauses to the next incarnation meanwhile
		}
		if len(taken) > 0 {
			in.wake() // with no group paused it may now stop idle
			for _, g := range taken {
				p.Logger.Info("sinkbatch: paused group handed over", slog.String("group", g.Group), slog.Duration("left", g.Left))
			}
		}
		return taken
	}
}

// Adopt is a message a batcher takes in its mailbox's order, as a
// delivery: it pauses Groups, handed over by another instance (see
// queue.adoptPauses), before any delivery sent after it is admitted, and
// then sends nil on Done, if set. A router that answers what it held
// instead (the destination is gone) sends its error there.
type Adopt struct {
	Groups []messages.PausedGroup
	Done   chan error // buffered: its one answer never blocks
}

// PausedGroups lists the paused groups of p's destination, sorted. Safe for
// concurrent use.
func (p *Params) PausedGroups() []string {
	in := p.current.Load()
	if in == nil {
		return nil
	}
	return in.d.pausedGroups(mono.Now())
}

// incarnation is what other goroutines reach of a running batcher: its
// rules, and a way to make the actor look at them again.
type incarnation struct {
	d    *dispatch
	wake func()
	left func() // a caller left: sweep for its room (Params.CallerLeft)
}

// startFlow sets up a new incarnation's flow rules: the adaptive limit
// starts at 1, and the groups a crashed incarnation had paused stay paused.
func (b *Batcher) startFlow() {
	if b.p.Tuning.Adaptive {
		b.d.lim = newLimiter(b.p.Tuning.MaxInflight)
		b.d.q.s.maxInflight = b.d.lim.limit
		b.recordLimit(b.d.lim.limit)
	}
	in := &incarnation{
		d:    b.d,
		wake: func() { b.box.tellPrompt(b.system, b.self, theDone) },
		left: func() { b.box.tellPrompt(b.system, b.self, theLeft) },
	}
	if prev := b.p.current.Load(); prev != nil {
		// A restart: the groups the crashed incarnation paused stay
		// paused, as they are when this one takes over (a ResumeGroup
		// may have resumed one since it ended).
		prev.d.handPausesTo(b.d, func() { b.p.current.Store(in) })
		return
	}
	b.p.current.Store(in)
}

// endFlow runs as the incarnation ends, after it answered what it held: a
// batcher that stops takes its limit off the gauge.
func (b *Batcher) endFlow(err error) {
	if err == messages.ErrStopped && b.p.Tuning.Adaptive {
		b.recordLimit(0)
	}
}

// retryAfter is the answer to a delivery refused for reason: a
// *messages.RetryAfterError drawn uniformly from (0, RetryAfterMax].
func (b *Batcher) retryAfter(reason messages.FullReason) error {
	return &messages.RetryAfterError{After: b.retryWait(), Reason: reason}
}

// retryWait is a wait drawn uniformly from (0, RetryAfterMax].
func (b *Batcher) retryWait() time.Duration {
	if b.p.Tuning.RetryAfterMax <= 0 {
		return 0 // a Batcher that Resolve did not set up (tests)
	}
	return time.Duration(rand.Int64N(int64(b.p.Tuning.RetryAfterMax))) + 1
}
