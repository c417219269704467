package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/actors/supervisor"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/mono"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// TracerName is the instrumentation scope of the tracer the instance takes
// from Config.TracerProvider.
const TracerName = "github.com/ankusa/sinkbatch"

// Defaults for a zero Config field.
const (
	DefaultName            = "sinkbatch"
	DefaultSinkConcurrency = 8
	DefaultTimeout         = 30 * time.Second
)

// Config configures an Instance. A zero field takes its default.
type Config struct {
	// Name is the instance's name: in actor names, logs and the metric
	// attribute "instance". Letters, digits, '-', '_' and '.'; default
	// "sinkbatch". Two instances in one actor system need different names.
	Name string
	// SinkConcurrency is the default Tuning.MaxInflight: requests in flight
	// per destination. Default 8.
	SinkConcurrency int
	// DefaultTimeout bounds deliveries that carry no deadline. Default 30s.
	DefaultTimeout time.Duration
	// Logger receives the instance's logs; nil: the actor system's logger.
	Logger *slog.Logger
	// MeterProvider receives the instance's OpenTelemetry metrics (see
	// package telemetry for the instruments); nil: no metrics. sinkbatch
	// never touches the global provider.
	MeterProvider metric.MeterProvider
	// Recorder receives flushes and refusals instead of MeterProvider, for
	// a metrics system of your own. Set one of the two at most.
	Recorder telemetry.Recorder
	// TracerProvider receives the instance's OpenTelemetry spans: a create
	// span per delivery, a child of the caller's span, and a send span per
	// request, linked to its messages' create spans (see package batcher);
	// each message carries its create span's context to the consumer, as
	// its codec writes it. nil: no spans, at the cost of a nil check.
	// sinkbatch never touches the global provider.
	TracerProvider trace.TracerProvider
}

// Stats is a snapshot of an instance's batchers and queues.
type Stats struct {
	Batchers    int   // batchers running
	Queued      int   // entries waiting, not in a request
	QueuedBytes int64 // their Size
	InFlight    int   // requests in flight
	Waiting     int   // deliveries blocked waiting for room (Tuning.WhenFull Block); see the package doc
}

// Instance is a running sinkbatch: one supervisor and a batcher per
// destination it has been sent to. Its methods are safe for concurrent use.
type Instance struct {
	system  *actor.ActorSystem
	cfg     Config
	sup     *supervisor.Supervisor
	timeout time.Duration
	metrics *telemetry.OTel // nil without a MeterProvider
	tracer  trace.Tracer    // from Config.TracerProvider; nil: no spans
	waiters waiters
	started atomic.Pointer[supervisor.Supervisor] // sup, for the gauge callback
}

// Start starts an instance in system. It returns an error if the config is
// invalid or the name is taken in this actor system. Stop it with Stop:
// system.Shutdown does not stop actors.
func Start(system *actor.ActorSystem, cfg Config) (*Instance, error) {
	if system == nil {
		return nil, fmt.Errorf("sinkbatch: Start: nil actor system")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if err := supervisor.CheckName(cfg.Name); err != nil {
		return nil, err
	}
	switch {
	case cfg.SinkConcurrency < 0:
		return nil, fmt.Errorf("sinkbatch: Config.SinkConcurrency %d is negative", cfg.SinkConcurrency)
	case cfg.DefaultTimeout < 0:
		return nil, fmt.Errorf("sinkbatch: Config.DefaultTimeout %v is negative", cfg.DefaultTimeout)
	}
	if cfg.SinkConcurrency == 0 {
		cfg.SinkConcurrency = DefaultSinkConcurrency
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = system.Logger()
	}
	if cfg.MeterProvider != nil && cfg.Recorder != nil {
		return nil, fmt.Errorf("sinkbatch: Config.MeterProvider and Config.Recorder are both set; set one")
	}
	inst := &Instance{system: system, cfg: cfg, timeout: cfg.DefaultTimeout}
	if cfg.TracerProvider != nil {
		inst.tracer = cfg.TracerProvider.Tracer(TracerName)
	}
	inst.waiters = waiters{system: system, prefix: "sinkbatch-" + cfg.Name + "$reply"}
	if cfg.MeterProvider != nil {
		// The gauges may be collected before Start has set inst.sup: they
		// read it through an atomic pointer and report zero until then.
		otel, err := telemetry.New(cfg.MeterProvider, cfg.Name, func() telemetry.Gauges {
			sup := inst.started.Load()
			if sup == nil {
				return telemetry.Gauges{}
			}
			s := sup.Stats()
			return telemetry.Gauges{Batchers: s.Batchers, Queued: s.Queued, QueuedBytes: s.QueuedBytes, InFlight: s.InFlight}
		})
		if err != nil {
			return nil, err
		}
		inst.metrics, cfg.Recorder = otel, otel
	}
	if cfg.Recorder == nil {
		cfg.Recorder = telemetry.Nop{}
	}
	sup, err := supervisor.Start(system, supervisor.Config{
		Name:            cfg.Name,
		SinkConcurrency: cfg.SinkConcurrency,
		DefaultTimeout:  cfg.DefaultTimeout,
		Logger:          cfg.Logger,
		Recorder:        cfg.Recorder,
		Tracer:          inst.tracer,
	})
	if err != nil {
		if inst.metrics != nil {
			_ = inst.metrics.Close()
		}
		return nil, err
	}
	inst.sup = sup
	inst.started.Store(sup)
	return inst, nil
}

// ErrNilContext answers a method of Instance (Deliver, Stop, ResumeGroup,
// ...) called with a nil context, which then does nothing. Permanent
// (codec.IsPermanent): pass context.Background() or a context with the
// caller's deadline.
var ErrNilContext = codec.Permanent(errors.New("sinkbatch: nil context"))

// Deliver sends m to the destination c describes and returns when m's own
// result is known: the destination's message id, or why it was not accepted
// (see package messages for what each error means). It waits until ctx's
// deadline, or DefaultTimeout when ctx has none; if ctx ends first, Deliver
// returns ctx.Err() and m is never sent unless its batch already left.
//
// m's Body and Attributes are read until m's request has ended, which can be
// after Deliver returned on a cancelled ctx: do not change them after the
// call (hand Deliver a buffer of its own, as with an http.Request's body).
//
// Deliver is a request-reply like protoactor's RequestFuture, on reply
// processes the instance pools for its callers rather than on protoactor's
// Future, which writes a reply outside its lock: there a reply racing a
// timeout or a cancel is a data race, and a caller that gives up at its
// deadline is routine here.
func (i *Instance) Deliver(ctx context.Context, c codec.Codec, m codec.Message) (string, error) {
	r, err := i.DeliverResult(ctx, c, m)
	return r.ID, err
}

// DeliverResult is Deliver returning the destination's whole answer for m:
// its message id and, where the destination assigns one (SQS FIFO queues),
// its sequence number. The error is the same as Deliver's; Result.Err is nil.
func (i *Instance) DeliverResult(ctx context.Context, c codec.Codec, m codec.Message) (codec.Result, error) {
	if ctx == nil {
		return codec.Result{}, ErrNilContext
	}
	if c == nil {
		return codec.Result{}, messages.ErrNilCodec
	}
	if err := ctx.Err(); err != nil {
		return codec.Result{}, err
	}
	if i.sup.Stopping() {
		return codec.Result{}, messages.ErrStopped
	}
	w := i.waiters.get()
	defer i.waiters.put(w)
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline {
		w.bound(0)
	} else {
		deadline = time.Now().Add(i.timeout)
		w.bound(mono.AddSat(mono.Now(), int64(i.timeout)))
	}
	// One record holds the call's Deliver, its sender PID, the Direct that
	// names both to the batcher and the room for the batcher's entry. It
	// serves another call once both this call and the batcher have let go
	// of it (see call).
	rec := newCall()
	defer rec.Release()
	rec.deliver = messages.Deliver{Codec: c, Message: m, Deadline: deadline}
	sender := &rec.sender
	w.begin(sender, i.system.Address())
	rec.direct = batcher.Direct{Listener: w, Sender: sender, Room: &rec.room}
	d := &rec.deliver
	d.Ref = &rec.direct
	var span trace.Span
	if i.tracer != nil {
		// The create span starts and ends here, on the caller's goroutine,
		// off the batcher's actor.
		var tc codec.TraceContext
		if span, tc = batcher.StartCreate(ctx, i.tracer, i.cfg.Logger); span != nil {
			rec.direct.Span = span
			if tc != (codec.TraceContext{}) {
				d.Message.Trace = tc
			}
		} else {
			d.SpanContext = trace.SpanContextFromContext(ctx)
		}
	}
	// No envelope: the sender travels in Direct.
	i.system.Root.Send(i.sup.PID(), d)
	var r codec.Result
	if done := ctx.Done(); done == nil {
		// A ctx that never ends: the answer, or errNoAnswer from w's
		// timer at DefaultTimeout, is all there is to wait for.
		r = <-w.answer
	} else {
		select {
		case r = <-w.answer:
		case <-done:
			w.abandon(sender)
			// The caller's word to the batcher holding its entry: drop
			// it unsent and free its room (batcher.Room.Leave).
			rec.room.Leave()
			if span != nil {
				batcher.AbandonCreate(span, i.cfg.Logger)
			}
			if ctx.Err() == context.Canceled {
				i.sup.Cancelled(c)
			}
			return codec.Result{}, ctx.Err()
		}
	}
	if r.Err == errNoAnswer {
		if span != nil {
			batcher.AbandonCreate(span, i.cfg.Logger)
		}
		return codec.Result{}, fmt.Errorf("sinkbatch: no answer within DefaultTimeout %v: %w", i.timeout, context.DeadlineExceeded)
	}
	if span != nil {
		batcher.EndCreate(span, r, i.cfg.Logger)
	}
	if r.Err != nil {
		return codec.Result{}, r.Err
	}
	return r, nil
}

// call is one Deliver call's record: what it sends and who is answered.
//
// A record is shared by two parties, the call and the batcher that takes
// its Room, and serves another call only once both have let go of it: the
// call when Deliver returns, the batcher when it has answered the call
// from its request's result (batcher.Owner), which can come after the call
// gave up. Whichever lets go last puts it back in the pool. A batcher that
// never lets go (the call was refused, expired, answered by a restart, or
// the Deliver never reached a batcher) leaves the record to the collector,
// so a record a batcher may still read is never handed to another call.
type call struct {
	deliver messages.Deliver
	sender  actor.PID
	direct  batcher.Direct
	room    batcher.Room
	refs    atomic.Int32 // parties still holding the record
}

// calls are the records that no party holds.
var calls = sync.Pool{New: func() any { return new(call) }}

// newCall returns a zeroed record held by the call and by the batcher that
// will take its Room.
func newCall() *call {
	rec := calls.Get().(*call)
	rec.refs.Store(2)
	rec.room.SetOwner(rec)
	return rec
}

// Release lets go of rec for one party; the last one resets it and puts it
// back in the pool.
func (rec *call) Release() {
	if rec.refs.Add(-1) == 0 {
		*rec = call{}
		calls.Put(rec)
	}
}

// PID is where actors send *messages.Deliver, with ctx.Request or a future,
// to be answered with one *messages.Delivered. The PID runs no mailbox of its
// own: the send goes from the sender's goroutine straight to the
// destination's batcher.
func (i *Instance) PID() *actor.PID { return i.sup.PID() }

// System is the actor system the instance runs in (Start's).
func (i *Instance) System() *actor.ActorSystem { return i.system }

// Stats reads the instance's counters. It is cheap (five atomic loads) and
// safe from any goroutine.
func (i *Instance) Stats() Stats {
	s := i.sup.Stats()
	return Stats{Batchers: s.Batchers, Queued: s.Queued, QueuedBytes: s.QueuedBytes, InFlight: s.InFlight, Waiting: s.Waiting}
}

// Stop stops the instance, in this order: new deliveries are answered with
// messages.ErrStopped; every batcher sends what it has queued at once (no
// linger) and waits for its requests in flight; when every delivery received
// before Stop is answered, the batchers and their supervisor are stopped; the
// PID stays registered and answers later senders ErrStopped (a new instance
// of the same name takes it over). If ctx ends first, whatever is still queued or in
// flight, and every delivery still on its way to a batcher's mailbox, is
// answered with ErrStopped before Stop returns (protoactor would drop a
// stopped actor's mailbox silently), in-flight requests are cancelled, and
// Stop returns an error wrapping ctx.Err(). That last answering takes a
// moment, not a request. Only a codec stuck in Size or Validate can hold it
// up: Stop then waits 5s for the mailboxes, logs an error naming what is
// lost (the deliveries still in that batcher's mailbox), and waits at most
// protoactor's 10s for the stuck batcher to stop. Stop may be called more
// than once; later calls wait for the first (each until its own ctx ends).
// A nil ctx is answered ErrNilContext and stops nothing.
func (i *Instance) Stop(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	err := i.sup.Stop(ctx)
	i.waiters.close()
	if i.metrics != nil {
		// The gauges stop with the instance; its counters stay exported.
		_ = i.metrics.Close()
	}
	return err
}
