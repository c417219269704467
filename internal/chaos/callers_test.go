package chaos_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// lateGrace is how long after its deadline a caller may still be answered.
const lateGrace = 100 * time.Millisecond

// errNoAnswer is what an actor caller concludes when no answer came by its
// deadline (plus lateGrace): it gives up on the attempt, as a dispatch
// attempt would, and may try again with the same idempotency key.
var errNoAnswer = fmt.Errorf("chaos: no answer by the deadline: %w", context.DeadlineExceeded)

// callerActor delivers on behalf of one worker goroutine with ctx.Request to
// the instance's PID, and counts the *messages.Delivered each Ref gets: a
// second answer to a Ref, or none at all, is a broken promise.
type callerActor struct {
	inst   *actors.Instance
	system *actor.ActorSystem
	pid    *actor.PID

	mu    sync.Mutex
	next  uint64
	refs  map[uint64]*answer
	stray int // answers to a Ref this actor never sent
}

// answer is what one Ref got.
type answer struct {
	label    string
	sent     time.Time
	deadline time.Time
	ch       chan *messages.Delivered // the first answer, for the worker
	count    int
	at       time.Time // when the first answer came
	err      error
}

// attempt asks the actor to send d.
type attempt struct{ d *messages.Deliver }

func spawnCaller(system *actor.ActorSystem, inst *actors.Instance) *callerActor {
	a := &callerActor{inst: inst, system: system, refs: map[uint64]*answer{}}
	a.pid = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }))
	return a
}

func (a *callerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *attempt:
		ctx.Request(a.inst.PID(), m.d)
	case *messages.Delivered:
		now := time.Now()
		ref, _ := m.Ref.(uint64)
		a.mu.Lock()
		p := a.refs[ref]
		first := false
		if p == nil {
			a.stray++
		} else {
			p.count++
			if first = p.count == 1; first {
				p.at, p.err = now, m.Err
			}
		}
		a.mu.Unlock()
		if first {
			p.ch <- m // buffered: never blocks
		}
	}
}

// deliver sends one attempt through the actor and waits for its answer until
// deadline plus lateGrace.
func (a *callerActor) deliver(label string, c codec.Codec, m codec.Message, deadline time.Time) (string, error) {
	p := &answer{label: label, sent: time.Now(), deadline: deadline, ch: make(chan *messages.Delivered, 1)}
	a.mu.Lock()
	a.next++
	ref := a.next
	a.refs[ref] = p
	a.mu.Unlock()
	a.system.Root.Send(a.pid, &attempt{d: &messages.Deliver{Codec: c, Message: m, Deadline: deadline, Ref: ref}})
	t := time.NewTimer(time.Until(deadline) + lateGrace)
	defer t.Stop()
	select {
	case d := <-p.ch:
		return d.ID, d.Err
	case <-t.C:
		return "", errNoAnswer
	}
}

// answerStats sums what the actor's Refs got.
type answerStats struct {
	refs, twice, never, stray int
	// Answers later than deadline + lateGrace + slack (the scheduler's own
	// lag in this run): for entries still queued at their deadline, which
	// the batcher must answer then, and for entries in a request, which it
	// answers when the request ends (by the latest deadline of the batch).
	lateQueued, lateInFlight int
	lateWorst                time.Duration
	lateByKind               map[string]int
	neverAnswered            []string
}

// queuedKinds are the answers an entry gets without being sent: a refusal,
// or its deadline passing while it waits.
var queuedKinds = map[string]bool{"expired": true, "full_entries": true, "full_bytes": true, "full_tenant": true, "stopped": true}

func (a *callerActor) stats(into *answerStats, slack time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	into.stray += a.stray
	for _, p := range a.refs {
		into.refs++
		switch {
		case p.count == 0:
			into.never++
			into.neverAnswered = append(into.neverAnswered, fmt.Sprintf("%s sent %s deadline %s",
				p.label, p.sent.Format("15:04:05.000"), p.deadline.Format("15:04:05.000")))
			continue
		case p.count > 1:
			into.twice++
		}
		over := p.at.Sub(p.deadline)
		if over <= lateGrace+slack {
			continue
		}
		kind := errKind(p.err)
		into.lateByKind[kind]++
		into.lateWorst = max(into.lateWorst, over.Round(time.Millisecond))
		if queuedKinds[kind] {
			into.lateQueued++
		} else {
			into.lateInFlight++
		}
	}
}

// unanswered counts the Refs without an answer so far.
func (a *callerActor) unanswered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, p := range a.refs {
		if p.count == 0 {
			n++
		}
	}
	return n
}

// logCounter is a slog.Handler that counts the instance's lifecycle logs and
// keeps a few unexpected warnings.
type logCounter struct {
	restarts, idleStops, started, sendPanics, sizePanics, refused atomic.Int64

	mu      sync.Mutex
	other   []string
	crashes []string // reasons of crashes the chaos recorder did not cause
}

func (l *logCounter) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo
}

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	switch r.Message {
	case "sinkbatch: batcher crashed; restarting it":
		l.restarts.Add(1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "reason" && !strings.Contains(a.Value.String(), "chaos: Recorder.Refused panics") {
				l.mu.Lock()
				l.crashes = append(l.crashes, a.Value.String())
				l.mu.Unlock()
			}
			return true
		})
	case "sinkbatch: batcher stopped idle":
		l.idleStops.Add(1)
	case "sinkbatch: batcher started":
		l.started.Add(1)
	case "sinkbatch: codec panicked in SendBatch":
		l.sendPanics.Add(1)
	case "sinkbatch: codec panicked in Size":
		l.sizePanics.Add(1)
	case "sinkbatch: the destination refused a message":
		l.refused.Add(1)
	default:
		if r.Level >= slog.LevelWarn {
			l.mu.Lock()
			if len(l.other) < 10 {
				l.other = append(l.other, r.Message)
			}
			l.mu.Unlock()
		}
	}
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) crashReasons() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.crashes...)
}

func (l *logCounter) unexpected() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.other...)
}
