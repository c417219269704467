package batcher

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/telemetry"
)

// Counters are an instance's queue state. Batchers add their changes as they
// happen; Stats reads them from any goroutine without asking an actor.
type Counters struct {
	Batchers    atomic.Int64
	Queued      atomic.Int64 // entries waiting, not in a request
	QueuedBytes atomic.Int64
	InFlight    atomic.Int64 // requests in flight
	Waiting     atomic.Int64 // deliveries waiting for room (WhenFull Block)
}

// Params configure one batcher incarnation: one per destination from the
// first delivery until the batcher stops idle. They outlive restarts, so what
// must survive a crash (the count of deliveries received, the count of
// incarnations, Stop's drain) lives here rather than in the actor.
type Params struct {
	Name   string // the destination's name: the actor's name, in logs
	Sink   string // Codec.Name(), read once by the supervisor
	Codec  codec.Codec
	Tuning codec.Tuning // resolved by Resolve: no zero field
	// OneGroup is Limits().OneGroupPerRequest: each batch holds one group.
	OneGroup       bool
	DefaultTimeout time.Duration
	Logger         *slog.Logger
	Recorder       telemetry.SinkRecorder
	Tracer         trace.Tracer // nil: no spans
	Counters       *Counters
	Requests       *sync.WaitGroup // request goroutines; Stop waits for them
	// Cancels counts the instance's Deliver callers that gave up before
	// their deadline. A batcher refusing for fullness sweeps the queue when
	// it or the earliest deadline has moved (and at most every
	// fullSweepEvery otherwise), so a full queue costs O(1) per refused
	// delivery.
	Cancels *atomic.Uint64

	goroutines   atomic.Int64 // request goroutines running, of every incarnation
	received     uint64       // deliveries received, across restarts; only the actor touches it
	drain        *Drain       // Stop's drain, once begun: a restart does not end it
	aborted      bool         // Stop's context ended: every delivery is answered ErrStopped, across restarts too
	incarnations uint64       // incarnations of the actor object, across restarts
	// bufs holds the *buffers of request goroutines that ended, for the
	// next to start: a busy destination whose goroutines come and go with
	// its batches would otherwise allocate a batch's worth of messages and
	// results each time. They are put back cleared (see request).
	bufs sync.Pool
	// current is the running incarnation, for ResumeGroup and PausedGroups
	// from other goroutines, and, as the next one starts, the crashed one
	// whose paused groups it takes over (startFlow).
	current atomic.Pointer[incarnation]
	// waiting is the running incarnation's count of deliveries waiting for
	// room (WhenFull Block), as of its last advance: CallerLeft wakes the
	// actor only when someone waits.
	waiting atomic.Int64
}

// CallerLeft tells the destination's batcher that one of its callers gave
// up before its deadline (its context was cancelled), so that the room its
// entry held goes at once to a delivery waiting for room (WhenFull Block):
// the actor sweeps the queue for callers that left and admits the waiters
// that fit, in the same turn of its mailbox. Without waiters it does
// nothing: the next delivery that needs room sweeps. Safe for concurrent
// use.
func (p *Params) CallerLeft() {
	if p.waiting.Load() == 0 {
		return
	}
	if in := p.current.Load(); in != nil {
		in.left()
	}
}

// Resolve checks a codec's Limits and Tuning and returns the tuning with
// every zero field replaced by its default. MaxInflight defaults to
// sinkConcurrency. The error names the value that is wrong, and is
// permanent (codec.IsPermanent).
func Resolve(c codec.Codec, sinkConcurrency int) (codec.Tuning, error) {
	lim := c.Limits()
	if lim.MaxEntries <= 0 {
		return codec.Tuning{}, codec.Permanent(fmt.Errorf("sinkbatch: codec %q: Limits().MaxEntries %d is not positive", c.Name(), lim.MaxEntries))
	}
	if lim.MaxBytes <= 0 || lim.MaxBytes > math.MaxInt32 {
		return codec.Tuning{}, codec.Permanent(fmt.Errorf("sinkbatch: codec %q: Limits().MaxBytes %d is not in [1, 2 GiB)", c.Name(), lim.MaxBytes))
	}
	t := c.Tuning()
	if err := t.Check(lim); err != nil {
		return codec.Tuning{}, fmt.Errorf("sinkbatch: codec %q: %w", c.Name(), err)
	}
	orDefault(&t.MaxEntries, lim.MaxEntries)
	orDefault(&t.MaxBytes, lim.MaxBytes)
	orDefault(&t.MaxInflight, sinkConcurrency)
	orDefault(&t.QueueMax, codec.DefaultQueueMax)
	orDefault(&t.TenantMax, codec.DefaultTenantMax)
	if t.QueueMaxBytes == 0 {
		// The default never refuses a message that fits one request:
		// such a message would be told to retry forever.
		t.QueueMaxBytes = max(codec.DefaultQueueMaxBytes, int64(t.MaxBytes))
	}
	orDefault(&t.Linger, codec.DefaultLinger)
	orDefault(&t.RetryAfterMax, codec.DefaultRetryAfterMax)
	orDefault(&t.IdleTimeout, codec.DefaultIdleTimeout)
	orDefault(&t.GroupPauseMax, codec.DefaultGroupPauseMax)
	return t, nil
}

// orDefault sets a zero *v to d.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

func settingsOf(t codec.Tuning, oneGroup bool) settings {
	return settings{
		oneGroup:      oneGroup,
		maxEntries:    t.MaxEntries,
		maxBytes:      t.MaxBytes,
		maxInflight:   t.MaxInflight,
		linger:        int64(t.Linger),
		queueMax:      t.QueueMax,
		queueMaxBytes: t.QueueMaxBytes,
		tenantMax:     t.TenantMax,
		block:         t.WhenFull == codec.Block,
		strict:        t.StrictGroups,
		pauseMax:      int64(t.GroupPauseMax),
	}
}
