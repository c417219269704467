package adversary_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// This file is the round's telemetry: a Recorder that panics now and then
// (in Refused, which runs in a batcher's Receive and so restarts it; in
// Answered, Waited and Flushed, which must be harmless), and a
// TracerProvider whose spans count their Ends.

// crashRecorder is a Config.Recorder whose sink recorders panic with the
// probabilities the round drew. It is a DeliveryRecorder too.
type crashRecorder struct {
	r                                    *round
	pRefused, pAnswered, pWaited, pFlush float64

	mu    sync.Mutex
	sinks map[string]*sinkRec
}

// sinkRec is one destination's recorder: what it was told and how often it
// panicked.
type sinkRec struct {
	c *crashRecorder
	d *dest

	rmu sync.Mutex
	rng *rand.Rand

	refusedPanics, answeredPanics, waitedPanics, flushPanics atomic.Int64
	firstCrash                                               atomic.Int64 // Unix nanoseconds of the first panic in Refused; 0: none
	answered                                                 [8]atomic.Int64
}

func (c *crashRecorder) Sink(sink string) telemetry.SinkRecorder {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sinks[sink]; s != nil {
		return s
	}
	var d *dest
	for _, x := range c.r.dests {
		if x.name == sink {
			d = x
		}
	}
	if d == nil {
		c.r.violate("recorder-unknown-sink", "Recorder.Sink(%q): no destination of that name", sink)
		d = c.r.dests[0]
	}
	s := &sinkRec{c: c, d: d, rng: rand.New(rand.NewPCG(c.r.seed, uint64(6000+d.idx)))}
	c.sinks[sink] = s
	return s
}

func (s *sinkRec) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.rng.Float64() < p
}

func (s *sinkRec) Flushed(telemetry.Flush) {
	if s.chance(s.c.pFlush) {
		s.flushPanics.Add(1)
		panic("adversary: Recorder.Flushed panics")
	}
}

// Refused panics in the batcher's Receive: the batcher restarts, and the
// refused delivery, like everything the batcher held, is answered
// ErrBatcherDown.
func (s *sinkRec) Refused(messages.FullReason) {
	if s.chance(s.c.pRefused) {
		s.firstCrash.CompareAndSwap(0, time.Now().UnixNano())
		s.refusedPanics.Add(1)
		panic("adversary: Recorder.Refused panics")
	}
}

func (s *sinkRec) Answered(o telemetry.Outcome) {
	if int(o) >= 0 && int(o) < len(s.answered) {
		s.answered[o].Add(1)
	} else {
		s.c.r.violate("answered-outcome", "Recorder.Answered(%v): no such outcome", o)
	}
	if s.chance(s.c.pAnswered) {
		s.answeredPanics.Add(1)
		panic("adversary: Recorder.Answered panics")
	}
}

func (s *sinkRec) Waited(d time.Duration) {
	if d < 0 {
		s.c.r.violate("waited-negative", "Recorder.Waited(%v)", d)
	}
	if s.chance(s.c.pWaited) {
		s.waitedPanics.Add(1)
		panic("adversary: Recorder.Waited panics")
	}
}

// crashedBefore says whether d's batcher had crashed (a panic in Refused
// or in a caller's Listening) by at: an ErrBatcherDown answer before that
// has no cause.
func (r *round) crashedBefore(d *dest, at time.Time) bool {
	if d == nil {
		return false
	}
	if lc := d.listenCrash.Load(); lc != 0 && lc <= at.UnixNano() {
		return true
	}
	if r.rec == nil {
		return false
	}
	r.rec.mu.Lock()
	s := r.rec.sinks[d.name]
	r.rec.mu.Unlock()
	if s == nil {
		return false
	}
	fc := s.firstCrash.Load()
	return fc != 0 && fc <= at.UnixNano()
}

// drawTelemetry draws the round's Recorder and TracerProvider, from a
// stream of their own so that the rest of a seed's configuration is what it
// was before they existed.
func (r *round) drawTelemetry() {
	rng := rand.New(rand.NewPCG(r.seed, 2))
	crash, recPanic := r.on("crash") && rng.IntN(2) == 0, r.on("recpanic") && rng.IntN(2) == 0
	if crash || recPanic {
		r.rec = &crashRecorder{r: r, sinks: map[string]*sinkRec{}}
		if crash {
			r.rec.pRefused = []float64{0.01, 0.05, 0.2, 0.5}[rng.IntN(4)]
		}
		if recPanic {
			r.rec.pAnswered = rng.Float64() * 0.05
			r.rec.pWaited = rng.Float64() * 0.05
			r.rec.pFlush = rng.Float64() * 0.05
		}
	}
	if r.on("tracing") && rng.IntN(2) == 0 {
		var s sdktrace.Sampler
		switch x := rng.IntN(4); x {
		case 0:
			s, r.sampler = sdktrace.AlwaysSample(), "always"
		case 1:
			s, r.sampler = sdktrace.NeverSample(), "never"
		case 2:
			s, r.sampler = sdktrace.TraceIDRatioBased(0.5), "ratio"
		default:
			s, r.sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.3)), "parentbased"
		}
		r.spanRec = tracetest.NewSpanRecorder()
		sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSpanProcessor(r.spanRec))
		r.tp = &countingProvider{TracerProvider: sdk, sdk: sdk, r: r, spans: map[trace.SpanID]*spanRec{}}
		r.callerTracer = sdk.Tracer("adversary-caller")
	}
}

// config is the instance's Config with the round's telemetry.
func (r *round) config() actors.Config {
	cfg := actors.Config{Name: r.name, SinkConcurrency: r.conc, DefaultTimeout: r.defaultTimeout, Logger: slog.New(r.logs)}
	if r.rec != nil {
		cfg.Recorder = r.rec
	}
	if r.tp != nil {
		cfg.TracerProvider = r.tp
	}
	return cfg
}

// parentSpan draws, in a tracing round, the caller's span: none, or one of
// the caller's own (sampled or not, as the sampler says).
func (r *round) parentSpan(rng *rand.Rand) trace.SpanContext {
	if r.tp == nil || rng.IntN(2) == 0 {
		return trace.SpanContext{}
	}
	_, span := r.callerTracer.Start(context.Background(), "caller")
	span.End()
	return span.SpanContext()
}

// countingProvider wraps the SDK's TracerProvider: the instance's tracer
// returns spans that count their Ends, whether their sampler records them
// or not, and note the message id a create span is given.
type countingProvider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider
	r   *round

	mu    sync.Mutex
	spans map[trace.SpanID]*spanRec
	order []*spanRec
}

type countingTracer struct {
	trace.Tracer
	p *countingProvider
}

// spanRec is one span the instance started.
type spanRec struct {
	name    string
	sc      trace.SpanContext
	parent  trace.SpanContext
	started time.Time
	ends    atomic.Int32
	msgID   atomic.Pointer[string]
	body    atomic.Pointer[string] // the body id of the message that carried it (create spans)
	renamed atomic.Pointer[string] // the name SetName gave it
	sampled bool                   // its sampler records it
}

// isCreate reports whether a span started as name is a create span: the
// batcher names it after its destination, the front door's Deliver starts
// it as "create" (and the batcher renames it at admission if it records).
func isCreate(name string) bool {
	return name == "create" || strings.HasPrefix(name, "create ")
}

type countedSpan struct {
	trace.Span
	rec *spanRec
	p   *countingProvider
}

func (p *countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	t := p.TracerProvider.Tracer(name, opts...)
	if name != actors.TracerName {
		p.r.violate("tracer-name", "the instance asked for tracer %q, want %q", name, actors.TracerName)
	}
	return &countingTracer{Tracer: t, p: p}
}

func (t *countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	ctx, span := t.Tracer.Start(ctx, name, opts...)
	rec := &spanRec{name: name, sc: span.SpanContext(), parent: parent, started: time.Now(), sampled: span.IsRecording()}
	t.p.mu.Lock()
	if _, dup := t.p.spans[rec.sc.SpanID()]; dup {
		t.p.r.violate("span-id-reused", "span %s started twice", rec.sc.SpanID())
	}
	t.p.spans[rec.sc.SpanID()] = rec
	t.p.order = append(t.p.order, rec)
	t.p.mu.Unlock()
	cs := &countedSpan{Span: span, rec: rec, p: t.p}
	return trace.ContextWithSpan(ctx, cs), cs
}

func (s *countedSpan) End(opts ...trace.SpanEndOption) {
	if n := s.rec.ends.Add(1); n > 1 {
		s.p.r.violate("span-ended-twice", "span %q %s ended %d times", s.rec.name, s.rec.sc.SpanID(), n)
	}
	s.Span.End(opts...)
}

func (s *countedSpan) SetName(name string) {
	s.rec.renamed.Store(&name)
	s.Span.SetName(name)
}

func (s *countedSpan) SetAttributes(kv ...attribute.KeyValue) {
	for _, a := range kv {
		if a.Key == "messaging.message.id" {
			v := a.Value.AsString()
			s.rec.msgID.Store(&v)
		}
	}
	s.Span.SetAttributes(kv...)
}

func (p *countingProvider) byID(id trace.SpanID) *spanRec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spans[id]
}

// checkTrace is the codec's look at a message's Trace: in a tracing round
// it names a create span the instance started, of the caller's trace, that
// no other message carries; otherwise it is empty.
func (d *dest) checkTrace(m codec.Message) {
	r := d.r
	if r.tp == nil {
		if m.Trace != (codec.TraceContext{}) {
			r.violate("trace-untraced", "%s: message %s carries Trace %+v; the instance does not trace", d.name, bodyID(m), m.Trace)
		}
		return
	}
	tid, sid, sampled, ok := parseTraceparent(m.Trace.Parent)
	if !ok {
		r.violate("trace-missing", "%s: message %s carries Trace %+v, not a traceparent", d.name, bodyID(m), m.Trace)
		return
	}
	rec := r.tp.byID(sid)
	switch {
	case rec == nil:
		r.violate("trace-unknown-span", "%s: message %s carries span %s, which the instance never started", d.name, bodyID(m), sid)
		return
	case !isCreate(rec.name):
		r.violate("trace-not-create", "%s: message %s carries span %q", d.name, bodyID(m), rec.name)
		return
	case rec.name == "create" && rec.sampled && (rec.renamed.Load() == nil || !strings.HasPrefix(*rec.renamed.Load(), "create ")):
		r.violate("trace-create-unnamed", "%s: message %s was admitted, but its recorded create span is not named after its destination", d.name, bodyID(m))
	case rec.sc.TraceID() != tid || rec.sc.IsSampled() != sampled:
		r.violate("trace-mismatch", "%s: message %s carries %q; its create span is %s sampled %v", d.name, bodyID(m), m.Trace.Parent, rec.sc.TraceID(), rec.sc.IsSampled())
	case m.Trace.State != rec.sc.TraceState().String():
		r.violate("trace-mismatch", "%s: message %s carries tracestate %q; its create span has %q", d.name, bodyID(m), m.Trace.State, rec.sc.TraceState())
	}
	body := bodyID(m)
	if prev := rec.body.Swap(&body); prev != nil && *prev != body {
		r.violate("trace-shared", "%s: messages %s and %s carry one create span %s", d.name, *prev, body, sid)
	}
	if c := r.callByBody(body); c != nil && c.parent.IsValid() {
		if tid != c.parent.TraceID() || rec.parent.SpanID() != c.parent.SpanID() {
			r.violate("trace-parent", "%s: message %s is of trace %s (create span's parent %s); its caller's span is %s/%s",
				d.name, body, tid, rec.parent.SpanID(), c.parent.TraceID(), c.parent.SpanID())
		}
	}
}

// parseTraceparent reads a W3C traceparent "00-<trace id>-<span id>-<flags>".
func parseTraceparent(s string) (trace.TraceID, trace.SpanID, bool, bool) {
	var tid trace.TraceID
	var sid trace.SpanID
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return tid, sid, false, false
	}
	if _, err := hex.Decode(tid[:], []byte(s[3:35])); err != nil {
		return tid, sid, false, false
	}
	if _, err := hex.Decode(sid[:], []byte(s[36:52])); err != nil {
		return tid, sid, false, false
	}
	var flags [1]byte
	if _, err := hex.Decode(flags[:], []byte(s[53:55])); err != nil {
		return tid, sid, false, false
	}
	return tid, sid, flags[0]&1 == 1, tid.IsValid() && sid.IsValid()
}

// checkTelemetry runs once the instance has stopped and every caller is
// answered or gone: every span the instance started has ended exactly once
// (waiting the slack for request goroutines that outlive Stop), a create
// span that was given a message id was given the id its caller got, and
// every panic the Recorder raised was logged, not a crash, except those in
// Refused, each of which restarted its batcher.
func (r *round) checkTelemetry() {
	if r.tp != nil {
		deadline := time.Now().Add(r.slack)
		open := r.openSpans()
		for len(open) > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			open = r.openSpans()
		}
		for _, s := range open[:min(len(open), 20)] {
			r.violate("span-open", "span %q %s (started %v into the round) never ended, %v after the round's end",
				s.name, s.sc.SpanID(), s.started.Sub(r.start), r.slack)
		}
		if len(open) > 20 {
			r.violate("span-open", "and %d more", len(open)-20)
		}
		r.tp.mu.Lock()
		spans := r.tp.order
		r.tp.mu.Unlock()
		for _, s := range spans {
			if !isCreate(s.name) {
				continue
			}
			r.spans.create++
			id := s.msgID.Load()
			if id == nil {
				continue
			}
			body := strings.TrimPrefix(*id, "id:")
			c := r.callByBody(body)
			if c == nil {
				continue // a delivery nobody waits for
			}
			c.mu.Lock()
			resID, err, n := c.resID, c.err, c.n
			c.mu.Unlock()
			if n > 0 && err == nil && resID != *id {
				r.violate("span-wrong-id", "%s: its create span has message id %q, the caller got %q", c.describe(), *id, resID)
			}
			if b := s.body.Load(); b != nil && *b != body {
				r.violate("span-wrong-id", "create span %s was carried by message %s but names message id %q", s.sc.SpanID(), *b, *id)
			}
		}
		r.spans.all = len(spans)
		// The SDK's own count of the recorded spans (the callers' spans are
		// in it too).
		if st, en := len(r.spanRec.Started()), len(r.spanRec.Ended()); st != en {
			r.violate("span-open", "the SDK's span recorder saw %d spans start and %d end", st, en)
		}
		for _, s := range r.spanRec.Ended() {
			if s.InstrumentationScope().Name == actors.TracerName {
				r.spans.recorded++
			}
		}
		_ = r.tp.sdk.Shutdown(context.Background())
	}
	var listenPanics int64
	if r.listen != nil {
		listenPanics = r.listen.panics.Load()
		r.listenPanics = int(listenPanics)
	}
	restarts := int64(r.logs.count("sinkbatch: batcher crashed; restarting it"))
	if r.rec == nil {
		// A panic in Listening restarts its batcher, unless the panic was
		// on a request goroutine of an incarnation already restarted.
		if restarts > listenPanics {
			r.violate("crash-from-nowhere", "%d batcher restarts, %d panics in Listening (the round's only crash source)", restarts, listenPanics)
		}
		return
	}
	var refused, answeredP, waitedP, flushP int64
	r.rec.mu.Lock()
	sinks := r.rec.sinks
	r.rec.mu.Unlock()
	var ok int64
	for _, s := range sinks {
		refused += s.refusedPanics.Load()
		answeredP += s.answeredPanics.Load()
		waitedP += s.waitedPanics.Load()
		flushP += s.flushPanics.Load()
		ok += s.answered[telemetry.OutcomeOK].Load()
	}
	r.crashes = int(refused)
	r.recPanics = int(answeredP + waitedP + flushP)
	if restarts > refused+listenPanics {
		r.violate("crash-from-nowhere", "%d batcher restarts, %d panics in Recorder.Refused and %d in Listening (the round's only crash sources)", restarts, refused, listenPanics)
	}
	if restarts < refused && r.stopCalled.Load() == 0 {
		r.violate("crash-not-restarted", "%d panics in Recorder.Refused, %d batcher restarts", refused, restarts)
	}
	for _, x := range []struct {
		method string
		raised int64
	}{{"Answered", answeredP}, {"Waited", waitedP}, {"Flushed", flushP}} {
		if logged := int64(r.logs.count("sinkbatch: Recorder." + x.method + " panicked")); logged != x.raised {
			r.violate("recorder-panic-log", "Recorder.%s panicked %d times, logged %d", x.method, x.raised, logged)
		}
	}
	// Every acknowledged caller was counted as answered ok; no more were
	// than the destinations stored.
	stored := 0
	for _, d := range r.dests {
		d.mu.Lock()
		stored += d.nStored
		d.mu.Unlock()
	}
	if ok < int64(r.acked) || ok > int64(stored) {
		r.violate("answered-count", "Recorder.Answered(ok) %d times; %d callers were acknowledged, %d messages stored", ok, r.acked, stored)
	}
}

// openSpans are the spans the instance started and has not ended.
func (r *round) openSpans() []*spanRec {
	r.tp.mu.Lock()
	defer r.tp.mu.Unlock()
	var open []*spanRec
	for _, s := range r.tp.order {
		if s.ends.Load() == 0 {
			open = append(open, s)
		}
	}
	return open
}

func (s spanCounts) String() string {
	return fmt.Sprintf("%d spans (%d create, %d recorded)", s.all, s.create, s.recorded)
}

// spanCounts are a tracing round's figures.
type spanCounts struct{ all, create, recorded int }
