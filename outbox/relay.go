package outbox

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// Defaults for zero Config fields.
const (
	DefaultLease         = 30 * time.Second
	DefaultInflight      = 4096
	DefaultClaimBatch    = 2000
	DefaultPollInterval  = 100 * time.Millisecond
	DefaultFlushInterval = 50 * time.Millisecond
	DefaultFlushRows     = 1000
	DefaultBackoff       = 100 * time.Millisecond
	DefaultMaxBackoff    = 30 * time.Second
	DefaultPausedDelay   = 100 * time.Millisecond
)

// Config configures a Relay. Zero fields take the defaults above. Keep
// Inflight within what the destinations queue (Tuning.QueueMax, and
// TenantMax per tenant): a refusal for fullness puts rows back.
type Config struct {
	DB       *pgxpool.Pool
	Table    string // default "sinkbatch_outbox"
	Sender   Sender
	Lease    time.Duration // how long a claimed row stays claimed; default 30s
	Inflight int           // rows being delivered at once by this relay; default 4096
	Logger   *slog.Logger
	// MeterProvider receives the metrics listed in the package doc; nil:
	// none (the global provider is never read).
	MeterProvider metric.MeterProvider

	// ClaimBatch is the most rows one claim takes; default 2000, at most
	// Inflight. A busy relay claims a batch while it begins the last one's
	// rows, so a claim costs its round trip and a walk past the rows in
	// flight: larger claims cost less per row, up to half of Inflight.
	ClaimBatch int
	// PollInterval is how long a relay whose last claim found fewer rows
	// than it asked for waits before it claims again.
	PollInterval time.Duration
	// FlushInterval is the longest a known result waits before it is
	// written; FlushRows results are written at once.
	FlushInterval time.Duration
	FlushRows     int
	// Backoff and MaxBackoff shape the full-jitter delay before a row
	// whose delivery failed retryably may be claimed again: uniform in
	// [0, min(MaxBackoff, Backoff·2^(attempts-1))).
	Backoff, MaxBackoff time.Duration
	// PausedDelay bounds the delay (uniform, full jitter) before a row
	// answered *messages.GroupPausedError may be claimed again.
	PausedDelay time.Duration
	// MaxAttempts marks a row dead once it has been claimed this many
	// times and fails retryably again; 0: never.
	MaxAttempts int
	// KeepSent is how long a sent row stays in the table (state 1, with
	// its message id and sent_at); 0 deletes it in the statement that
	// records its result. The relay deletes kept rows once older.
	KeepSent time.Duration
}

// Stats are a relay's counts since New.
type Stats struct {
	Claimed  int64 // rows claimed (a row claimed again counts again)
	Sent     int64 // rows whose message was accepted
	Retried  int64 // rows put back to be claimed again (a retryable failure, a paused group, a full queue)
	Dead     int64 // rows refused for good
	Inflight int64 // rows being delivered now
	// Statements is the number of statements that changed rows' state
	// (claims and result writes), not counting KeepSent's clean-up.
	Statements int64
}

// Relay relays one outbox table's rows through a Sender. It is safe for
// concurrent use; Run runs once at a time.
//
// Goroutines: Run's loop owns the loop state (claims, windows, marks) and
// makes every statement; the Sender's answer callbacks only append to done
// under mu and signal wake; Stats, OldestUnsent and the metrics callback
// read atomics and the database.
type Relay struct {
	// Set by New, then read only.
	cfg     Config
	table   string // quoted
	leases  string // the side table of group leases, quoted
	lockKey int64
	// owner is this Run's id in the owner column: new for each Run, and
	// after each claim that failed, so that rows a previous Run left
	// claimed, or that a claim the relay saw fail took all the same (the
	// server committed it before the error), block their groups like any
	// other relay's: the relay does not know them, and its later claims
	// must not pass them.
	owner   atomic.Int64
	log     *slog.Logger
	sender  OrderedSender
	metrics *metrics

	running atomic.Bool // a Run is running
	runs    uint64      // Runs started; touched only by Run, which runs once at a time

	// Written by Run's loop, read by Stats and the metrics.
	claimed, sent, retried, dead, inflight, statements atomic.Int64

	mu   sync.Mutex
	done []answer      // answers not yet taken by Run's loop; guarded by mu
	wake chan struct{} // capacity 1: a callback's non-blocking nudge to Run's loop
}

// answer is one delivery's result, as the Sender reported it.
type answer struct {
	p   *pendingRow
	r   codec.Result
	err error
}

// New checks cfg and returns a relay. It does not touch the database.
func New(cfg Config) (*Relay, error) {
	if cfg.DB == nil {
		return nil, errors.New("sinkbatch/outbox: Config.DB is nil")
	}
	if cfg.Sender == nil {
		return nil, errors.New("sinkbatch/outbox: Config.Sender is nil")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if err := checkTable(cfg.Table); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Lease", int64(cfg.Lease)}, {"Inflight", int64(cfg.Inflight)}, {"ClaimBatch", int64(cfg.ClaimBatch)},
		{"PollInterval", int64(cfg.PollInterval)}, {"FlushInterval", int64(cfg.FlushInterval)},
		{"FlushRows", int64(cfg.FlushRows)}, {"Backoff", int64(cfg.Backoff)}, {"MaxBackoff", int64(cfg.MaxBackoff)},
		{"PausedDelay", int64(cfg.PausedDelay)}, {"MaxAttempts", int64(cfg.MaxAttempts)}, {"KeepSent", int64(cfg.KeepSent)},
	} {
		if f.v < 0 {
			return nil, fmt.Errorf("sinkbatch/outbox: Config.%s is negative", f.name)
		}
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.Lease, DefaultLease)
	def(&cfg.PollInterval, DefaultPollInterval)
	def(&cfg.FlushInterval, DefaultFlushInterval)
	def(&cfg.Backoff, DefaultBackoff)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	def(&cfg.PausedDelay, DefaultPausedDelay)
	if cfg.Lease < 100*time.Millisecond {
		return nil, fmt.Errorf("sinkbatch/outbox: Config.Lease %v is below 100ms", cfg.Lease)
	}
	if cfg.Inflight == 0 {
		cfg.Inflight = DefaultInflight
	}
	if cfg.ClaimBatch == 0 {
		cfg.ClaimBatch = DefaultClaimBatch
	}
	cfg.ClaimBatch = min(cfg.ClaimBatch, cfg.Inflight)
	if cfg.FlushRows == 0 {
		cfg.FlushRows = DefaultFlushRows
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Relay{
		cfg:     cfg,
		lockKey: claimLock(cfg.Table),
		log:     cfg.Logger.With("outbox", cfg.Table),
		wake:    make(chan struct{}, 1),
	}
	r.table, _ = ident(cfg.Table)
	r.leases = leasesTable(cfg.Table)
	if o, ok := cfg.Sender.(OrderedSender); ok {
		r.sender = o
	} else {
		r.sender = &serialSender{Sender: cfg.Sender, groups: map[string][]serialCall{}}
	}
	if cfg.MeterProvider != nil {
		m, err := newMetrics(cfg.MeterProvider, r)
		if err != nil {
			return nil, err
		}
		r.metrics = m
	}
	return r, nil
}

// randomID is a random non-zero int64: a relay's owner id, or a claim's.
func randomID() int64 {
	var b [8]byte
	for {
		_, _ = crand.Read(b[:])
		if v := int64(binary.LittleEndian.Uint64(b[:]) >> 1); v != 0 {
			return v
		}
	}
}

// Stats returns the relay's counts.
func (r *Relay) Stats() Stats {
	return Stats{
		Claimed: r.claimed.Load(), Sent: r.sent.Load(), Retried: r.retried.Load(), Dead: r.dead.Load(),
		Inflight: r.inflight.Load(), Statements: r.statements.Load(),
	}
}

// OldestUnsent is the age of the table's oldest unsent row (claimed or
// not), 0 when there is none.
func (r *Relay) OldestUnsent(ctx context.Context) (time.Duration, error) {
	var secs *float64
	err := r.cfg.DB.QueryRow(ctx, fmt.Sprintf(
		`SELECT extract(epoch FROM now() - created_at)::float8 FROM %s WHERE state = 0 ORDER BY id LIMIT 1`, r.table)).Scan(&secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil || secs == nil {
		return 0, err
	}
	return time.Duration(*secs * float64(time.Second)), nil
}

// pendingRow is a claimed row this relay is delivering.
type pendingRow struct {
	run      uint64 // the Run that claimed it
	id       int64
	claim    int64
	attempts int
	group    groupKey
	lease    *lease    // its claim's lease on its group; nil without a group
	deadline time.Time // when the Sender stops trying
	// Touched only by Run's loop:
	answered bool // its answer is recorded (or it was put back unsent)
	begun    bool // handed to the Sender
	recorded bool // a result of it is in the marks (written, or to be)

	destination string
	message     codec.Message
}

type groupKey struct{ destination, group string }

// lease is one claim's hold on one group: a row of the leases table,
// which keeps other relays' claims from the group's rows after the
// claim's first row of it. Its rows are the claim's rows of the group
// whose result is not in the marks yet; the write that records the last
// of them deletes the lease's row, in the same transaction. Touched only
// by Run's loop.
type lease struct {
	claim int64
	group groupKey
	rows  int
}

// window is what a relay holds of one (destination, group). Every row
// begun while the window is open gets the window's deadline, so a later
// row never outlives an earlier one in the Sender's queue: were an earlier
// row dropped at its deadline while a later one is still sent, the later
// one would reach the destination first. A window older than half a
// lease holds new rows back until it drains, then opens afresh for them.
// After an answer other than success the group's rows claimed since are
// put back, not begun, until that answer and every row put back after it
// are written: the put-back rows then block their group in every relay's
// claims, this one's too, and the first of them is claimed first. Claims
// begun meanwhile skip the group (see claimSQL), so that rows claimed
// before the failure was known, and put back as they arrive, are the last
// to wait for.
type window struct {
	n        int           // rows begun and not answered
	deadline time.Time     // the deadline of every row begun in this window
	held     []*pendingRow // claimed rows waiting for the window to drain, in row order
	failures int           // marks of the group's rows other than sent (failed or put back) not written yet
}

// failing reports whether rows of the group wait for marks to be written.
func (w *window) failing() bool { return w.failures > 0 }

// marks are results waiting to be written.
type marks struct {
	sentIDs []int64
	sentMsg []string
	// put back (retry) or dead
	ids, claims, delays []int64
	undo                []int32
	dead                []bool
	errs                []string
	// leases whose last row is among the results above: deleted with them
	released []*lease
	// one group per failure counted in its window (window.failures), told
	// once these marks are written
	failed []groupKey
	since  time.Time // when the oldest waiting result came
}

func (m *marks) len() int { return len(m.sentIDs) + len(m.ids) + len(m.released) }

func (m *marks) reset() {
	m.sentIDs, m.sentMsg = m.sentIDs[:0], m.sentMsg[:0]
	m.ids, m.claims, m.delays, m.undo, m.dead, m.errs = m.ids[:0], m.claims[:0], m.delays[:0], m.undo[:0], m.dead[:0], m.errs[:0]
	m.released, m.failed = m.released[:0], m.failed[:0]
}

// add appends o's marks to m (a claim that carried o failed: o waits with
// the marks that came since).
func (m *marks) add(o *marks) {
	if o.len() == 0 && len(o.failed) == 0 {
		return
	}
	if m.len() == 0 || o.since.Before(m.since) {
		m.since = o.since
	}
	m.sentIDs, m.sentMsg = append(m.sentIDs, o.sentIDs...), append(m.sentMsg, o.sentMsg...)
	m.ids, m.claims, m.delays = append(m.ids, o.ids...), append(m.claims, o.claims...), append(m.delays, o.delays...)
	m.undo, m.dead, m.errs = append(m.undo, o.undo...), append(m.dead, o.dead...), append(m.errs, o.errs...)
	m.released, m.failed = append(m.released, o.released...), append(m.failed, o.failed...)
}

// loop is Run's state, touched only by Run's goroutine.
type loop struct {
	run     uint64               // which Run this is (Relay.runs)
	groups  map[groupKey]*window // deleted when empty
	pending []*pendingRow        // rows not answered yet, in claim order; compacted as they are answered
	marks   marks                // results not written yet, nor in a claim under way
	// claiming is the claim under way, if any: its answer comes on
	// claimed. At most one is under way, and nothing else is written
	// meanwhile.
	claiming *claimCall
	claimed  chan *claimCall
	// overdueAt: no begun row is overdue (see expire) before this
	overdueAt  time.Time
	nextClaim  time.Time // no claim before this (the last found too little, or failed)
	nextSweep  time.Time // KeepSent clean-up
	flushFails int
	flushAt    time.Time // after a failed write: no write before this
}

// Run claims and delivers rows until ctx ends, then stops claiming, waits for what it holds (bounded by
// Lease) and returns.
//
// Errors from the database are logged and the statement is tried again
// later; Run returns an error only when it cannot start (the table is
// missing, or Run is already running), and nil when ctx ends. The results
// it knows when it returns are written (within 10s); rows whose result is
// not known stay claimed until their lease ends.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("sinkbatch/outbox: Run is already running")
	}
	defer r.running.Store(false)
	r.owner.Store(randomID())
	// Rows an earlier Run left without an answer are not this Run's: their
	// leases will end, and a late answer is ignored (an acceptance still
	// written).
	r.inflight.Store(0)
	r.runs++
	if _, err := r.cfg.DB.Exec(ctx, fmt.Sprintf(`SELECT lease_until FROM %s LIMIT 0`, r.table)); err != nil {
		return fmt.Errorf("sinkbatch/outbox: table %s (CreateTable makes it, or adds what a table of an earlier version lacks): %w", r.cfg.Table, err)
	}
	if _, err := r.cfg.DB.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s LIMIT 0`, r.leases)); err != nil {
		return fmt.Errorf("sinkbatch/outbox: table %s_leases (CreateTable makes it): %w", r.cfg.Table, err)
	}
	l := &loop{groups: map[groupKey]*window{}, run: r.runs, claimed: make(chan *claimCall, 1)}
	var stopAt time.Time // set when ctx ends
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		r.take(l, now)
		stopping := !stopAt.IsZero()
		if stopping && l.claiming == nil && (r.inflight.Load() == 0 || !now.Before(stopAt)) {
			r.finish(ctx, l)
			return nil
		}
		if !stopping && r.cfg.KeepSent > 0 && !now.Before(l.nextSweep) {
			r.sweepSent(ctx)
			l.nextSweep = now.Add(min(max(r.cfg.KeepSent/4, time.Second), time.Minute))
		}
		overdue := r.expire(l, now)
		claim := r.claimRoom(l, now, stopping)
		// A claim writes the marks in its own round trip (see
		// startClaim); nothing is written while one is under way.
		due := stopping || l.flushFails > 0 || l.marks.len() >= r.cfg.FlushRows || now.Sub(l.marks.since) >= r.cfg.FlushInterval
		if l.claiming == nil && l.marks.len() > 0 && due && !now.Before(l.flushAt) && !(claim > 0 && l.flushFails == 0) {
			r.flush(ctx, l)
		}
		if claim > 0 {
			r.startClaim(ctx, l, claim)
		}
		// Wait for an answer, a timer, or the end.
		next := now.Add(time.Hour)
		if l.marks.len() > 0 && l.claiming == nil { // a claim under way wakes the loop as it ends
			next = maxTime(l.marks.since.Add(r.cfg.FlushInterval), l.flushAt)
		}
		if !stopping {
			if l.nextClaim.After(now) {
				next = minTime(next, l.nextClaim)
			}
			if r.cfg.KeepSent > 0 {
				next = minTime(next, l.nextSweep)
			}
		} else {
			next = minTime(next, stopAt)
		}
		next = minTime(next, overdue)
		timer.Reset(max(next.Sub(now), time.Millisecond))
		done := ctx.Done()
		if stopping {
			done = nil
		}
		select {
		case <-r.wake:
		case c := <-l.claimed:
			r.finishClaim(ctx, l, c, stopping)
		case <-timer.C:
		case <-done:
			stopAt = time.Now().Add(r.cfg.Lease)
			// Rows not begun go back at once.
			for _, w := range l.groups {
				for _, h := range w.held {
					r.putBack(l, h, time.Now())
				}
				w.held = nil
			}
			l.pending = slices.DeleteFunc(l.pending, func(p *pendingRow) bool { return p.answered })
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// finish writes the results known when Run stops, on a context of its own.
func (r *Relay) finish(ctx context.Context, l *loop) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for range 3 {
		if l.marks.len() == 0 {
			return
		}
		r.flush(wctx, l)
	}
}

// answerFor is the callback a delivery's result comes back through.
func (r *Relay) answerFor(p *pendingRow) func(codec.Result, error) {
	return func(res codec.Result, err error) {
		r.mu.Lock()
		r.done = append(r.done, answer{p: p, r: res, err: err})
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// take turns the answers that came in into marks.
func (r *Relay) take(l *loop, now time.Time) {
	r.mu.Lock()
	done := r.done
	r.done = nil
	r.mu.Unlock()
	for _, a := range done {
		r.answered(l, a, now)
	}
	if len(done) > 0 {
		l.pending = slices.DeleteFunc(l.pending, func(p *pendingRow) bool { return p.answered })
	}
}

// answered records one answer and moves its group's window on.
func (r *Relay) answered(l *loop, a answer, now time.Time) {
	p := a.p
	if p.run != l.run || p.answered { // an earlier Run's, or expire gave up on it: its lease is long over
		if a.err == nil {
			r.record(l, a, now) // the message is there all the same
		}
		return
	}
	p.answered = true
	r.inflight.Add(-1)
	r.record(l, a, now)
	if p.group.group == "" {
		return
	}
	w := l.groups[p.group]
	if w == nil {
		return
	}
	w.n--
	if a.err != nil {
		r.fail(l, p.group, w)
		for _, h := range w.held {
			r.putBack(l, h, now)
		}
		w.held = nil
	}
	r.advance(l, p.group, w, now)
}

// fail counts one mark of a row of w's group, other than sent, that the
// group waits for (see window).
func (r *Relay) fail(l *loop, k groupKey, w *window) {
	w.failures++
	l.marks.failed = append(l.marks.failed, k)
}

// advance opens a drained window afresh for its held rows, or deletes it.
func (r *Relay) advance(l *loop, k groupKey, w *window, now time.Time) {
	if w.n > 0 || w.failing() {
		return
	}
	if len(w.held) == 0 {
		delete(l.groups, k)
		return
	}
	held := w.held
	w.held = nil
	w.deadline = held[0].deadline
	for _, h := range held {
		r.begin(l, h, w)
	}
}

// putBack writes p back unsent, as it was before its claim, without a
// delay: a row of its group before it blocks it. Its group waits for it to
// be written.
func (r *Relay) putBack(l *loop, p *pendingRow, now time.Time) {
	p.answered = true
	r.inflight.Add(-1)
	r.record(l, answer{p: p, err: errHeldBack}, now)
	if w := l.groups[p.group]; w != nil && p.group.group != "" {
		r.fail(l, p.group, w)
	}
}

// errHeldBack is what a row put back unsent, behind an earlier row of its
// group that failed, is recorded with.
var errHeldBack = errors.New("sinkbatch/outbox: held back behind an earlier row of its group")

// begin hands p to the Sender in window w (nil: no group).
func (r *Relay) begin(l *loop, p *pendingRow, w *window) {
	if w != nil {
		w.n++
		p.deadline = w.deadline
	}
	p.begun = true
	if at := p.deadline.Add(r.cfg.Lease); at.Before(l.overdueAt) {
		l.overdueAt = at
	}
	r.sender.Begin(p.destination, p.message, p.deadline, r.answerFor(p))
}

// expire gives up on begun rows whose answer is a Lease overdue (a
// Sender that lost it): their leases, long over, let any relay claim them
// again, and they are put back as failed. It returns when the next begun
// row will be overdue, and looks at the rows only from then on (begin
// brings that time forward).
func (r *Relay) expire(l *loop, now time.Time) (next time.Time) {
	if now.Before(l.overdueAt) {
		return l.overdueAt
	}
	defer func() { l.overdueAt = next }()
	next = now.Add(time.Hour)
	var lost []*pendingRow
	for _, p := range l.pending {
		if p.answered || !p.begun {
			continue
		}
		if at := p.deadline.Add(r.cfg.Lease); now.Before(at) {
			next = minTime(next, at)
		} else {
			lost = append(lost, p)
		}
	}
	for _, p := range lost {
		r.answered(l, answer{p: p, err: errNoAnswer}, now)
	}
	if len(lost) > 0 {
		r.log.Warn("outbox: no answer for rows long past their deadline; putting them back", "rows", len(lost))
		l.pending = slices.DeleteFunc(l.pending, func(p *pendingRow) bool { return p.answered })
	}
	return next
}

// errNoAnswer is recorded for a row whose answer never came.
var errNoAnswer = errors.New("sinkbatch/outbox: no answer from the Sender")

// record classifies one answer into the marks.
func (r *Relay) record(l *loop, a answer, now time.Time) {
	m := &l.marks
	if m.len() == 0 {
		m.since = now
	}
	// The first result of a row ends its claim's hold on it (a later one
	// is an acceptance that came after the row was given up on).
	if !a.p.recorded {
		a.p.recorded = true
		if ls := a.p.lease; ls != nil {
			if ls.rows--; ls.rows == 0 {
				m.released = append(m.released, ls)
			}
		}
	}
	if a.err == nil {
		m.sentIDs, m.sentMsg = append(m.sentIDs, a.p.id), append(m.sentMsg, a.r.ID)
		return
	}
	var (
		paused *messages.GroupPausedError
		full   *messages.RetryAfterError
		delay  time.Duration
		undo   int32
		dead   bool
	)
	switch {
	case a.err == errHeldBack:
		undo = 1
	case errors.As(a.err, &paused):
		delay, undo = jitter(r.cfg.PausedDelay), 1
	case errors.As(a.err, &full):
		delay, undo = full.After, 1
	case codec.IsPermanent(a.err):
		dead = true
	case r.cfg.MaxAttempts > 0 && a.p.attempts >= r.cfg.MaxAttempts:
		dead = true
	default:
		ceiling := r.cfg.MaxBackoff
		if shift := a.p.attempts - 1; shift < 40 && r.cfg.Backoff<<shift < ceiling && r.cfg.Backoff<<shift > 0 {
			ceiling = r.cfg.Backoff << shift
		}
		delay = jitter(ceiling)
	}
	text := a.err.Error()
	if len(text) > 4096 {
		text = text[:4096]
	}
	m.ids, m.claims, m.delays = append(m.ids, a.p.id), append(m.claims, a.p.claim), append(m.delays, delay.Microseconds())
	m.undo, m.dead, m.errs = append(m.undo, undo), append(m.dead, dead), append(m.errs, text)
}

// jitter is uniform in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// claimedRow is one row a claim returned.
type claimedRow struct {
	id                              int64
	destination, tenant, group, key string
	body                            []byte
	attributes                      []byte
	attempts                        int
}

// claimCall is one claim under way: what it carries, and, once its
// goroutine is done, what it found.
type claimCall struct {
	n       int       // the most rows it asks for
	token   int64     // its claim's id
	owner   int64     // the owner id it claims as
	started time.Time // when it was sent
	marks   *marks    // the results it writes first; nil: none
	writes  int       // statements those take

	// Set by its goroutine:
	rows []claimedRow
	err  error
}

// startClaim sends a claim of up to n claimable rows, on a goroutine of its
// own; finishClaim takes its answer, on claimed. A row is claimable when it
// is unsent, its lease or backoff is over, no earlier unsent row of its
// (destination, group) is leased by another relay or waiting out a
// backoff, and its group is not failing in this relay (see window).
// Claims hold the table's advisory lock exclusively, and result writes
// hold it shared, so a claim never sees a half-written result. The results
// waiting to be written go first, in the claim's transaction and round
// trip (unless writing them failed lately: then they wait for flush, and
// the claim goes alone), so that the claim sees them as a claim after a
// flush would.
func (r *Relay) startClaim(ctx context.Context, l *loop, n int) {
	c := &claimCall{n: n, token: randomID(), owner: r.owner.Load(), started: time.Now()}
	b := &pgx.Batch{}
	b.Queue(claimSetup, r.lockKey)
	if l.marks.len() > 0 && l.flushFails == 0 {
		// The claim's goroutine reads these marks: the loop records new
		// results in a fresh set meanwhile.
		taken := l.marks
		c.marks = &taken
		l.marks = marks{}
		c.writes = r.queueMarks(b, c.marks)
	}
	var skipDest, skipGroup []string
	for k, w := range l.groups {
		if w.failing() {
			skipDest, skipGroup = append(skipDest, k.destination), append(skipGroup, k.group)
		}
	}
	b.Queue(claimSQL(r.table, r.leases), c.owner, n, c.token, r.cfg.Lease.Microseconds(), skipDest, skipGroup)
	l.claiming = c
	go func() {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.Lease/2)
		defer cancel()
		c.rows, c.err = r.sendClaim(qctx, b, c.writes)
		l.claimed <- c
	}()
}

// sendClaim sends a claim's batch: setup, writes, then the claim, whose
// rows it returns.
func (r *Relay) sendClaim(ctx context.Context, b *pgx.Batch, writes int) (rows []claimedRow, err error) {
	res := r.cfg.DB.SendBatch(ctx, b)
	_, err = res.Exec()
	for i := 0; err == nil && i < writes; i++ {
		_, err = res.Exec()
	}
	if err == nil {
		var q pgx.Rows
		q, err = res.Query()
		if err == nil {
			for q.Next() {
				var c claimedRow
				if err = q.Scan(&c.id, &c.destination, &c.tenant, &c.group, &c.key, &c.body, &c.attributes, &c.attempts); err != nil {
					break
				}
				rows = append(rows, c)
			}
			q.Close()
			if err == nil {
				err = q.Err()
			}
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return rows, err
}

// finishClaim takes the answer of the claim under way: the results it
// carried are written, and its rows are begun in row order. Before it
// begins them, the next claim is sent if there is room for it, so that
// the database claims while this relay begins rows: that claim skips the
// groups failing now, and rows of groups that fail later wait (window), so
// no row of a group begins before a row of it put back earlier.
func (r *Relay) finishClaim(ctx context.Context, l *loop, c *claimCall, stopping bool) {
	l.claiming = nil
	r.statements.Add(int64(1 + c.writes))
	now := time.Now()
	if c.err != nil {
		// The claim may have committed: its rows and group leases are
		// then this owner's, unknown to the relay. A new owner makes them
		// block this relay's later claims as they block other relays',
		// until their lease ends and they are claimed again, first. The
		// relay's own known claims block it too until their rows are
		// written.
		r.owner.Store(randomID())
		if ctx.Err() == nil {
			r.log.Error("outbox: claim failed", "err", c.err)
		}
		if c.marks != nil {
			c.marks.add(&l.marks)
			l.marks = *c.marks
			if ctx.Err() == nil { // at the end, finish writes them
				r.writeFailed(l, c.err)
			}
		}
		l.nextClaim = now.Add(r.cfg.PollInterval)
		return
	}
	if c.marks != nil {
		r.written(ctx, l, c.marks)
	}
	rows := c.rows
	if len(rows) < c.n {
		l.nextClaim = now.Add(r.cfg.PollInterval)
	}
	if len(rows) == 0 {
		return
	}
	slices.SortFunc(rows, func(a, b claimedRow) int { return int(min(max(a.id-b.id, -1), 1)) })
	r.claimed.Add(int64(len(rows)))
	if r.metrics != nil {
		r.metrics.claimed.Add(ctx, int64(len(rows)), r.metrics.attrs)
	}
	// Answers that came in meanwhile first: a failure holds its group back.
	r.take(l, now)
	r.inflight.Add(int64(len(rows)))
	if n := r.claimRoom(l, now, stopping); n > 0 {
		r.startClaim(ctx, l, n)
	}
	// The Sender gives up before the lease ends, so that its answer can
	// be written while the row is still this relay's.
	deadline := c.started.Add(r.cfg.Lease - r.cfg.Lease/4)
	leases := map[groupKey]*lease{}
	for _, row := range rows {
		p := &pendingRow{run: l.run, id: row.id, claim: c.token, attempts: row.attempts, group: groupKey{row.destination, row.group},
			deadline: deadline, destination: row.destination}
		if row.group != "" {
			ls := leases[p.group]
			if ls == nil {
				ls = &lease{claim: c.token, group: p.group}
				leases[p.group] = ls
			}
			ls.rows++
			p.lease = ls
		}
		p.message = codec.Message{Tenant: row.tenant, Group: row.group, IdempotencyKey: row.key, Body: row.body}
		if p.message.IdempotencyKey == "" {
			p.message.IdempotencyKey = strconv.FormatInt(row.id, 10)
		}
		l.pending = append(l.pending, p)
		if len(row.attributes) > 0 {
			var err error
			if p.message.Attributes, err = decodeAttributes(row.attributes); err != nil {
				err = codec.Permanent(fmt.Errorf("sinkbatch/outbox: row %d: attributes: %w", row.id, err))
				r.answered(l, answer{p: p, err: err}, now)
				continue
			}
		}
		if row.group == "" {
			r.begin(l, p, nil)
			continue
		}
		w := l.groups[p.group]
		switch {
		case w == nil:
			w = &window{deadline: deadline}
			l.groups[p.group] = w
			r.begin(l, p, w)
		case w.failing():
			r.putBack(l, p, now)
		case len(w.held) > 0 || w.deadline.Sub(now) < r.cfg.Lease/2:
			w.held = append(w.held, p)
		default:
			r.begin(l, p, w)
		}
	}
	l.pending = slices.DeleteFunc(l.pending, func(p *pendingRow) bool { return p.answered })
}

// claimRoom is how many rows to claim now: 0 when a claim is under way,
// the relay stops or waits before it claims again, a write that failed is
// due again (claims then go without the marks, and a claim sent as the
// last one ends would leave the write no turn), or fewer rows than a
// claim's worth have room (unless nothing is in flight).
func (r *Relay) claimRoom(l *loop, now time.Time, stopping bool) int {
	if l.claiming != nil || stopping || now.Before(l.nextClaim) {
		return 0
	}
	if l.flushFails > 0 && l.marks.len() > 0 && !now.Before(l.flushAt) {
		return 0
	}
	room := r.cfg.Inflight - int(r.inflight.Load())
	if room >= min(r.cfg.ClaimBatch, max(1, r.cfg.Inflight/2)) || (room > 0 && r.inflight.Load() == 0) {
		return min(room, r.cfg.ClaimBatch)
	}
	return 0
}

// claimSetup begins a claim's transaction: it takes the table's claim lock
// exclusively, and turns explicit sorts off for the rest of the
// transaction, so that the only plan that takes unsent rows in id order is
// a walk of the unsent rows' index that stops after the rows it needs; with
// sorts, a planner that misjudges how many rows are available (a table not
// yet analyzed, a burst of new rows) sorts every available row instead.
const claimSetup = `SELECT pg_advisory_xact_lock($1), set_config('enable_sort', 'off', true)`

// claimSQL is the claim: $1 the relay's owner id, $2 the most rows, $3
// the claim's token, $4 the lease in microseconds, $5 and $6 the
// destinations and groups of this relay's failing windows, whose rows it
// skips. It changes no indexed
// column of the rows it claims (owner, claim, attempts, lease_until), so
// that each row's new version can be a HOT update, and records one lease
// per group it took rows of. A group is blocked after its first row that
// another relay's live lease holds (from the leases table) or that waits
// out a backoff (available_at, through its index). The rows to update
// are found by the ctids the locking walk returned (= ANY), so the update
// is a TID scan whatever the planner thinks of the table's size; a row
// whose version changed since is not updated, hence not claimed.
func claimSQL(t, leases string) string {
	return fmt.Sprintf(`
WITH blocked AS (
	SELECT destination, grp, min(first) AS first
	FROM %[2]s
	WHERE lease_until > now() AND owner <> $1
	GROUP BY destination, grp
	UNION ALL
	SELECT destination, grp, min(id)
	FROM %[1]s
	WHERE state = 0 AND available_at > now() AND grp <> ''
	GROUP BY destination, grp
), c AS (
	SELECT o.ctid FROM %[1]s o
	WHERE o.state = 0 AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())
	  AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.destination = o.destination AND b.grp = o.grp AND b.first < o.id)
	  AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::text[]) AS f(destination, grp) WHERE f.destination = o.destination AND f.grp = o.grp)
	ORDER BY o.id
	LIMIT $2
	FOR UPDATE OF o SKIP LOCKED
), u AS (
	UPDATE %[1]s o SET owner = $1, claim = $3, attempts = o.attempts + 1,
		lease_until = now() + $4 * interval '1 microsecond'
	WHERE o.ctid = ANY (ARRAY(SELECT ctid FROM c))
	RETURNING o.id, o.destination, o.tenant, o.grp, o.idempotency_key, o.body, o.attributes, o.attempts
), held AS (
	INSERT INTO %[2]s (claim, destination, grp, owner, first, lease_until)
	SELECT $3, destination, grp, $1, min(id), now() + $4 * interval '1 microsecond'
	FROM u WHERE grp <> '' GROUP BY destination, grp
), expired AS (
	DELETE FROM %[2]s WHERE lease_until <= now()
)
SELECT id, destination, tenant, grp, idempotency_key, body, attributes, attempts FROM u`, t, leases)
}

// flush writes the marks: sent rows (deleted, or kept with their message
// id), then rows put back or dead, then the leases released, in one round
// trip and one transaction that holds the table's advisory lock shared.
func (r *Relay) flush(ctx context.Context, l *loop) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, r.lockKey)
	stmts := r.queueMarks(b, &l.marks)
	err := r.cfg.DB.SendBatch(qctx, b).Close()
	r.statements.Add(int64(stmts))
	if err != nil {
		r.writeFailed(l, err)
		return
	}
	r.written(ctx, l, &l.marks)
}

// queueMarks queues the statements that write m, and returns how many. A
// row is put back or marked dead only while its claim is still the one
// this relay made; a sent row whatever holds it, since its message is at
// the destination.
func (r *Relay) queueMarks(b *pgx.Batch, m *marks) int {
	stmts := 0
	if len(m.sentIDs) > 0 {
		stmts++
		if r.cfg.KeepSent == 0 {
			b.Queue(fmt.Sprintf(`DELETE FROM %s WHERE id = ANY($1) AND state = 0`, r.table), m.sentIDs)
		} else {
			b.Queue(fmt.Sprintf(`UPDATE %s o SET state = 1, sent_at = now(), message_id = m.mid, owner = NULL, claim = NULL, lease_until = NULL
FROM unnest($1::bigint[], $2::text[]) AS m(id, mid) WHERE o.id = m.id AND o.state = 0`, r.table), m.sentIDs, m.sentMsg)
		}
	}
	if len(m.ids) > 0 {
		stmts++
		b.Queue(fmt.Sprintf(`UPDATE %s o SET
	state = CASE WHEN m.dead THEN 2 ELSE 0 END,
	available_at = now() + m.delay * interval '1 microsecond',
	attempts = o.attempts - m.undo, last_error = m.err, owner = NULL, claim = NULL, lease_until = NULL
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::int[], $5::bool[], $6::text[]) AS m(id, claim, delay, undo, dead, err)
WHERE o.id = m.id AND o.claim = m.claim AND o.state = 0`, r.table), m.ids, m.claims, m.delays, m.undo, m.dead, m.errs)
	}
	if len(m.released) > 0 {
		stmts++
		claims, dests, groups := make([]int64, len(m.released)), make([]string, len(m.released)), make([]string, len(m.released))
		for i, ls := range m.released {
			claims[i], dests[i], groups[i] = ls.claim, ls.group.destination, ls.group.group
		}
		b.Queue(fmt.Sprintf(`DELETE FROM %s h USING unnest($1::bigint[], $2::text[], $3::text[]) AS m(claim, destination, grp)
WHERE h.claim = m.claim AND h.destination = m.destination AND h.grp = m.grp`, r.leases), claims, dests, groups)
	}
	return stmts
}

// writeFailed notes that writing the marks failed: they are tried again
// after a pause that grows; their rows stay claimed meanwhile.
func (r *Relay) writeFailed(l *loop, err error) {
	l.flushFails++
	r.log.Error("outbox: writing results failed; trying again", "err", err, "rows", l.marks.len())
	l.flushAt = time.Now().Add(min(time.Duration(l.flushFails)*r.cfg.FlushInterval, r.cfg.Lease/4))
}

// written takes m as written: groups that waited only for these marks go
// on, and the counts move. m is reset.
func (r *Relay) written(ctx context.Context, l *loop, m *marks) {
	l.flushFails = 0
	for _, k := range m.failed {
		if w := l.groups[k]; w != nil {
			if w.failures--; w.failures == 0 {
				r.advance(l, k, w, time.Now())
			}
		}
	}
	var dead, retried int64
	for _, d := range m.dead {
		if d {
			dead++
		} else {
			retried++
		}
	}
	sent := int64(len(m.sentIDs))
	r.sent.Add(sent)
	r.dead.Add(dead)
	r.retried.Add(retried)
	if r.metrics != nil {
		r.metrics.sent.Add(ctx, sent, r.metrics.attrs)
		r.metrics.dead.Add(ctx, dead, r.metrics.attrs)
		r.metrics.retried.Add(ctx, retried, r.metrics.attrs)
	}
	m.reset()
}

// sweepSent deletes sent rows older than KeepSent, sweepChunk rows per
// statement, until fewer than that are left or a second has passed (the
// next sweep goes on).
func (r *Relay) sweepSent(ctx context.Context) {
	const sweepChunk = 10_000
	start := time.Now()
	for time.Since(start) < time.Second {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		tag, err := r.cfg.DB.Exec(qctx, fmt.Sprintf(`DELETE FROM %[1]s WHERE id IN (
	SELECT id FROM %[1]s WHERE state = 1 AND sent_at < now() - $1 * interval '1 microsecond' LIMIT %[2]d)`, r.table, sweepChunk),
			r.cfg.KeepSent.Microseconds())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Error("outbox: deleting old sent rows failed", "err", err)
			}
			return
		}
		if tag.RowsAffected() < sweepChunk {
			return
		}
	}
}

// ExplainClaim returns PostgreSQL's plan for this relay's claim of
// ClaimBatch rows, to check that it stays an index scan at the table's
// size. The plan is made in a transaction set up as a claim's (the claim
// lock, no explicit sorts). With analyze, the claim runs (EXPLAIN ANALYZE)
// inside that transaction, which is rolled back, and the plan carries its
// timings.
func (r *Relay) ExplainClaim(ctx context.Context, analyze bool) (string, error) {
	tx, err := r.cfg.DB.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the rollback is the point
	if _, err := tx.Exec(ctx, claimSetup, r.lockKey); err != nil {
		return "", err
	}
	verb := "EXPLAIN"
	if analyze {
		verb = "EXPLAIN (ANALYZE, BUFFERS)"
	}
	rows, err := tx.Query(ctx, verb+claimSQL(r.table, r.leases), r.owner.Load(), r.cfg.ClaimBatch, int64(0), r.cfg.Lease.Microseconds(),
		[]string{}, []string{})
	if err != nil {
		return "", err
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			rows.Close()
			return "", err
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	return strings.Join(plan, "\n"), nil
}
