package batcher

import (
	"context"
	"errors"
	"fmt"
	"github.com/ankusa/sinkbatch/internal/mono"
	"log/slog"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/nilptr"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file is a request goroutine: it sends a batch, answers each of its
// callers with its own result, and hands its slot on.

// run is a request goroutine: it sends f, then each batch finish hands it,
// and tells the actor after each.
func (b *Batcher) run(f *inflight) {
	defer b.p.Requests.Done()
	buf, _ := b.p.bufs.Get().(*buffers)
	if buf == nil {
		buf = new(buffers)
	}
	defer b.p.bufs.Put(buf)
	for f != nil {
		// The callers that left are taken out first, so that nothing is
		// sent for them (leave).
		panicked := b.dropLeft(f, buf)
		var report telemetry.Flush
		o := outcome{skipped: true}
		switch {
		case panicked != nil:
			// A Listener or the rules panicked: the incarnation is
			// down, and the restart answers f's callers.
			b.d.markDown()
			f.cancel()
		case len(f.entries) == 0:
			f.cancel()
		default:
			report, o = b.request(f, buf)
		}
		// The failed entries' groups pause and the slot is handed on
		// (finishWith), then the callers are answered, so that a caller
		// told of a retryable failure finds its group paused (a
		// ResumeGroup it makes then resumes it), then the actor is told.
		now := mono.Now()
		o.won = buf.won
		r := b.d.finishWith(f, now, o)
		buf.won = r.won
		if !o.skipped {
			b.answer(f, buf, r.won)
		}
		next := r.next
		if panicked == nil {
			panicked = r.panicked
		}
		b.answerDropped(r.dropped, now)
		b.settle(r, now)
		if panicked != nil {
			tell(b.system, b.self, &goroutinePanic{from: b.d, reason: panicked, stack: debug.Stack()})
		}
		b.box.tellPrompt(b.system, b.self, theDone)
		if !o.skipped {
			b.flushed(report)
		}
		f = next
	}
}

// dropLeft asks whether each of f's callers still waits (alive: a
// Listener's Listening, or the process registry for an actor's sender),
// here on the request goroutine and outside every lock, and takes those
// that left out of f (dispatch.leave), answering what that drops. A panic
// in a Listener's code, or in the rules as they take the callers out, is
// returned, with f untouched.
func (b *Batcher) dropLeft(f *inflight, buf *buffers) (panicked any) {
	n := len(f.entries)
	if cap(buf.gone) < n {
		buf.gone = make([]bool, n)
	}
	gone := buf.gone[:n]
	some := false
	func() {
		defer func() { panicked = recover() }()
		for i, e := range f.entries {
			gone[i] = !b.alive(e)
			some = some || gone[i]
		}
	}()
	if panicked != nil || !some {
		return panicked
	}
	now := mono.Now()
	dropped, panicked := b.d.leave(f, gone, now)
	b.answerDropped(dropped, now)
	return panicked
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

// waited records how long each of f's entries waited for its request. A
// panic in the Recorder is logged, not raised.
func (b *Batcher) waited(f *inflight, start int64) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: Recorder.Waited panicked", slog.Any("panic", r))
		}
	}()
	for _, e := range f.entries {
		b.deliveries.Waited(time.Duration(start - e.admitted))
	}
}

// buffers are a request goroutine's slices, reused from one of its requests
// to the next, and by the destination's next goroutine (Params.bufs). They
// hold nothing between requests. SendBatch does not keep its batch (see
// codec.Codec).
type buffers struct {
	msgs    []codec.Message
	results []codec.Result
	won     []bool
	gone    []bool
}

// request sends f's batch and leaves each message's result in buf, for
// answer.
func (b *Batcher) request(f *inflight, buf *buffers) (telemetry.Flush, outcome) {
	defer f.cancel()
	n := len(f.entries)
	if cap(buf.msgs) < n {
		buf.msgs, buf.results = make([]codec.Message, n), make([]codec.Result, n)
	}
	msgs, results := buf.msgs[:n], buf.results[:n]
	report := telemetry.Flush{Trigger: f.trigger, Entries: n}
	for i, e := range f.entries {
		msgs[i] = *e.msg
		report.Bytes += int(e.size)
	}
	start := time.Now()
	if b.deliveries != nil {
		b.waited(f, mono.Instant(start))
	}
	var failed error
	report.Requests, failed = b.bisect(f.ctx, f.trigger, part{msgs: msgs, entries: f.entries, out: results})
	report.Bisections = report.Requests - 1
	report.Duration = time.Since(start)
	return report, b.learn(results, failed, report.Duration)
}

// answer answers each of f's callers whose claim finishWith won for it
// (won) with its result from buf, and lets go of the batch's payloads and
// ids: the goroutine may wait a while for its next request, or end.
func (b *Batcher) answer(f *inflight, buf *buffers, won []bool) {
	n := len(f.entries)
	msgs, results := buf.msgs[:n], buf.results[:n]
	defer clear(msgs)
	defer clear(results)
	for i, e := range f.entries {
		if won[i] {
			b.reply(e.to, results[i])
			release(e)
		}
	}
}

// part is a run of a batch being sent: its messages, the entries they came
// from, and where their results go, index for index.
type part struct {
	msgs    []codec.Message
	entries []*entry
	out     []codec.Result
}

func (p part) slice(i, j int) part {
	return part{msgs: p.msgs[i:j], entries: p.entries[i:j], out: p.out[i:j]}
}

// bisect sends p and writes one result per message into p.out. When the
// destination refuses the request for its content, it sends each half in
// turn, in order, until the refused messages stand alone. A half that fails
// for any other reason (throttling, a 5xx, a deadline) ends the bisection:
// the halves after it are not sent but answered with the same error, so that
// no entry overtakes an earlier one of its group that its caller will send
// again; for the same reason a group one of whose messages failed retryably
// in a half is held back in the halves after it (bisectHolding). It returns
// the number of requests it took and that failure, if any.
func (b *Batcher) bisect(ctx context.Context, trigger telemetry.Trigger, p part) (int, error) {
	res, err := b.send(ctx, trigger, p)
	n := len(p.msgs)
	switch {
	case err == nil:
		copy(p.out, res)
		return 1, nil
	case errors.Is(err, codec.ErrRefused) && n > 1:
		h := n / 2
		first, failed := b.bisect(ctx, trigger, p.slice(0, h))
		if failed != nil {
			fill(p.out[h:], failed)
			return 1 + first, failed
		}
		if held := retryableGroups(p.slice(0, h)); held != nil {
			second, failed := b.bisectHolding(ctx, trigger, p.slice(h, n), held)
			return 1 + first + second, failed
		}
		second, failed := b.bisect(ctx, trigger, p.slice(h, n))
		return 1 + first + second, failed
	case errors.Is(err, codec.ErrRefused):
		b.log.Warn("sinkbatch: the destination refused a message", slog.Any("error", err))
		fill(p.out, err)
		return 1, nil
	}
	fill(p.out, err)
	return 1, err
}

// retryableGroups maps each group whose first failed message in p failed
// with a retryable error (its caller will send it again) to that message's
// IdempotencyKey; nil when there is none.
func retryableGroups(p part) map[string]string {
	var held map[string]string
	for i, r := range p.out {
		g := p.msgs[i].Group
		if r.Err == nil || g == "" || codec.IsPermanent(r.Err) {
			continue
		}
		if held == nil {
			held = make(map[string]string)
		}
		if _, seen := held[g]; !seen {
			held[g] = p.msgs[i].IdempotencyKey
		}
	}
	return held
}

// bisectHolding is bisect for the messages of p whose group is not in held.
// The others are never sent: an earlier message of their group failed in an
// earlier half, and sending them would store them before it, which its
// caller will retry. They are answered *messages.GroupPausedError
// (retryable) naming that message's key.
func (b *Batcher) bisectHolding(ctx context.Context, trigger telemetry.Trigger, p part, held map[string]string) (int, error) {
	var send part
	var at []int
	for i, m := range p.msgs {
		if key, ok := held[m.Group]; ok && m.Group != "" {
			p.out[i] = codec.Result{Err: b.groupPaused(m.Group, key)}
			continue
		}
		send.msgs, send.entries, at = append(send.msgs, m), append(send.entries, p.entries[i]), append(at, i)
	}
	if len(send.msgs) == 0 {
		return 0, nil
	}
	send.out = make([]codec.Result, len(send.msgs))
	n, failed := b.bisect(ctx, trigger, send)
	for j, i := range at {
		p.out[i] = send.out[j]
	}
	return n, failed
}

func fill(out []codec.Result, err error) {
	for i := range out {
		out[i] = codec.Result{Err: err}
	}
}

// send makes one request, turning a panic or a result slice of the wrong
// length into an error for the whole request. When the instance traces, the
// request is a send span.
func (b *Batcher) send(ctx context.Context, trigger telemetry.Trigger, p part) (res []codec.Result, err error) {
	if b.tracing != nil {
		var span trace.Span
		ctx, span = b.tracing.startSend(ctx, trigger, p.entries)
		if span != nil {
			defer func() { b.tracing.endSend(span, err) }()
		}
	}
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sinkbatch: codec panicked in SendBatch", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			res, err = nil, fmt.Errorf("%w: %v", codec.ErrCodecPanic, r)
		}
	}()
	res, err = b.p.Codec.SendBatch(ctx, p.msgs)
	if err == nil && len(res) != len(p.msgs) {
		return nil, fmt.Errorf("%w: %d results for %d messages", codec.ErrResultCount, len(res), len(p.msgs))
	}
	err = vetError(err)
	for i := range res {
		if res[i].Err != nil {
			res[i].Err = vetError(res[i].Err)
		}
	}
	return res, err
}

// vetError is err, an error SendBatch returned (for the batch or for one
// message), unless the batcher could not read it (see unreadable): then a
// retryable error wrapping codec.ErrCodecPanic, as the request may have been
// made and the batcher cannot tell what the codec meant. It is read here,
// under SendBatch's recover, so that no answer panics later on a request
// goroutine, where nothing would recover it.
func vetError(err error) error {
	if why := unreadable(err); why != "" {
		return fmt.Errorf("%w: the error SendBatch returned %s", codec.ErrCodecPanic, why)
	}
	return err
}

// unreadable says why err, a codec's, cannot be read, or "" if it can (or
// is nil): it is a nil pointer (a typed nil, as a codec that sets a
// *codec.EntryError variable only on failure returns for a success), or its
// methods panic when the batcher asks what it is (Error, Is, As, Unwrap,
// PermanentFailure).
func unreadable(err error) (why string) {
	if err == nil {
		return ""
	}
	if nilptr.Is(err) {
		return fmt.Sprintf("is a nil %T", err)
	}
	defer func() {
		if r := recover(); r != nil {
			why = fmt.Sprintf("(%T) panicked when read: %v", err, r)
		}
	}()
	var after *messages.RetryAfterError
	_ = err.Error()
	_ = errors.As(err, &after)
	_ = codec.IsPermanent(err) || codec.IsThrottled(err) || errors.Is(err, codec.ErrRefused)
	return ""
}
