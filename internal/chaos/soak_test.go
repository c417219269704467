package chaos_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

var (
	soakFor  = flag.Duration("soak", 0, "run TestChaosSoak for this long instead of for -soak-n messages")
	soakN    = flag.Int("soak-n", 20000, "messages TestChaosSoak delivers when -soak is 0")
	soakSeed = flag.Uint64("soak-seed", 1130, "seed of TestChaosSoak's load and faults")
)

// The load's shape.
const (
	mainWorkers = 160 // callers of the three busy destinations
	idleWorkers = 3   // callers of the destination that keeps stopping idle
	tenants     = 16
	maxAttempts = 10  // failed attempts of a message before its caller gives up
	maxRefusals = 400 // RetryAfterError answers of a message before its caller gives up
	poisonShare = 0.004
	actorShare  = 0.3 // messages whose caller is an actor rather than Instance.Deliver
)

const (
	topicOrdered = "projects/chaos/topics/ordered"
	topicIdle    = "projects/chaos/topics/idle"
)

// destination is one queue or topic of the soak.
type destination struct {
	name     string
	codec    *chaosCodec
	tuning   codec.Tuning // as given; zero fields take defaults
	grouped  float64      // share of its messages that carry a group
	groups   int
	ordered  bool // the server keeps each group's order (not a standard queue)
	readBack func() []stored
}

type outcome int

const (
	inProgress outcome = iota
	acked
	permanent
	gaveUp
	stopped
)

// record is one message's life: what was sent and how it ended.
type record struct {
	dest     *destination
	tenant   string
	group    string
	key      string
	body     []byte
	poison   bool
	viaActor bool

	submitted int64 // logical clock when the first attempt was sent
	ackedAt   int64 // logical clock when the acknowledgement came
	outcome   outcome
	id        string
	attempts  int
	lastErr   error
}

// soak is one run's state.
type soak struct {
	seed   uint64
	inst   *actors.Instance
	system *actor.ActorSystem
	clock  atomic.Int64

	mu      sync.Mutex
	records []*record

	attempts, refusals atomic.Int64
	deliverOver        []time.Duration // how long after its deadline each Deliver returned, when it did; under mu
	kinds              sync.Map        // errKind → *atomic.Int64
}

func (s *soak) count(kind string) {
	v, _ := s.kinds.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// errKind names an attempt's outcome for the figures.
func errKind(err error) string {
	var ra *messages.RetryAfterError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, messages.ErrStopped):
		return "stopped"
	case errors.As(err, &ra):
		return "full_" + ra.Reason.String()
	case errors.Is(err, messages.ErrBatcherDown):
		return "batcher_down"
	case errors.Is(err, codec.ErrCodecPanic):
		return "codec_panic"
	case errors.Is(err, errNoAnswer):
		return "no_answer"
	case codec.IsPermanent(err):
		return "permanent"
	case strings.Contains(err.Error(), "deadline passed before the message was sent"):
		return "expired"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "retryable"
}

// worker is one caller goroutine: it sends each message until it is
// acknowledged, refused for good, or out of attempts.
type worker struct {
	s      *soak
	rng    *rand.Rand
	caller *callerActor
}

// timeout draws an attempt's deadline: some shorter than the destination's
// Linger, most between 100ms and 1.5s, some up to 4s.
func (w *worker) timeout(d *destination) time.Duration {
	linger := d.tuning.Linger
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1)) }
	switch x := w.rng.Float64(); {
	case x < 0.08:
		return between(time.Millisecond, linger-time.Millisecond)
	case x < 0.15:
		return between(linger, 100*time.Millisecond)
	case x < 0.85:
		return between(100*time.Millisecond, 1500*time.Millisecond)
	}
	return between(1500*time.Millisecond, 4*time.Second)
}

// dispatch sends r as a dispatch attempt would: the same idempotency key on
// every attempt, RetryAfterError honoured, permanent errors never retried.
func (w *worker) dispatch(r *record) {
	r.submitted = w.s.clock.Add(1)
	refusals := 0
	for r.attempts < maxAttempts {
		id, err := w.send(r, w.timeout(r.dest))
		w.s.attempts.Add(1)
		w.s.count(errKind(err))
		var ra *messages.RetryAfterError
		switch {
		case err == nil:
			r.ackedAt = w.s.clock.Add(1)
			r.id, r.outcome = id, acked
			return
		case errors.Is(err, messages.ErrStopped):
			r.outcome, r.lastErr = stopped, err
			return
		case errors.As(err, &ra):
			w.s.refusals.Add(1)
			if refusals++; refusals > maxRefusals {
				r.outcome, r.lastErr = gaveUp, err
				return
			}
			time.Sleep(ra.After) // a pause in this caller's load
			continue
		case codec.IsPermanent(err):
			r.outcome, r.lastErr = permanent, err
			return
		}
		r.attempts++
		r.lastErr = err
		time.Sleep(time.Duration(w.rng.Int64N(int64(time.Millisecond) << min(r.attempts, 5)))) // backoff: a pause
	}
	r.outcome = gaveUp
}

func (w *worker) send(r *record, timeout time.Duration) (string, error) {
	m := codec.Message{Tenant: r.tenant, Group: r.group, IdempotencyKey: r.key, Body: r.body}
	deadline := time.Now().Add(timeout)
	if r.viaActor {
		return w.caller.deliver(r.dest.name+" "+r.key, r.dest.codec, m, deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	id, err := w.s.inst.Deliver(ctx, r.dest.codec, m)
	if over := time.Since(deadline); over > lateGrace {
		w.s.mu.Lock()
		w.s.deliverOver = append(w.s.deliverOver, over)
		w.s.mu.Unlock()
	}
	return id, err
}

// message makes message i of kind for d; its shape depends only on the seed
// and i, not on scheduling.
func (s *soak) message(kind string, i int, d *destination) *record {
	rng := rand.New(rand.NewPCG(s.seed, uint64(i)<<8|uint64(kind[0])))
	r := &record{dest: d, key: fmt.Sprintf("s%d-%s-%d", s.seed, kind, i)}
	r.tenant = "t00" // the heavy tenant
	if rng.Float64() >= 0.3 {
		r.tenant = fmt.Sprintf("t%02d", 1+rng.IntN(tenants-1))
	}
	if rng.Float64() < d.grouped {
		r.group = fmt.Sprintf("%s-g%02d", d.name, rng.IntN(d.groups))
	}
	r.poison = rng.Float64() < poisonShare
	r.viaActor = rng.Float64() < actorShare
	size := 16 + rng.IntN(300)
	if rng.Float64() < 0.03 {
		size = 1000 + rng.IntN(2000)
	}
	var b strings.Builder
	b.WriteString(r.key)
	if r.poison {
		b.WriteString(" " + poisonMark)
	}
	b.WriteByte(' ')
	for b.Len() < size {
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
	r.body = []byte(b.String())
	s.mu.Lock()
	s.records = append(s.records, r)
	s.mu.Unlock()
	return r
}

// boundsSampler reads Stats from its own goroutine while the load runs.
type boundsSampler struct {
	samples                           int
	maxQueued, maxInFlight, maxActive int
	maxBytes                          int64
	stop, done                        chan struct{}
}

func sampleBounds(inst *actors.Instance) *boundsSampler {
	b := &boundsSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		tick := time.NewTicker(500 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-tick.C:
			}
			st := inst.Stats()
			b.samples++
			b.maxQueued = max(b.maxQueued, st.Queued)
			b.maxBytes = max(b.maxBytes, st.QueuedBytes)
			b.maxInFlight = max(b.maxInFlight, st.InFlight)
			b.maxActive = max(b.maxActive, st.Batchers)
		}
	}()
	return b
}

func (b *boundsSampler) finish() { close(b.stop); <-b.done }

// lagProbe measures how late goroutines of this process wake up for a timer,
// as the callers do for their deadlines: on a loaded machine that lag, not
// sinkbatch, decides how late a caller sees its answer.
type lagProbe struct {
	mu   sync.Mutex
	max  time.Duration
	stop chan struct{}
	wg   sync.WaitGroup
}

func probeLag(seed uint64) *lagProbe {
	p := &lagProbe{stop: make(chan struct{})}
	for n := range 8 {
		rng := rand.New(rand.NewPCG(seed, uint64(900+n)))
		p.wg.Go(func() {
			for {
				d := time.Millisecond + time.Duration(rng.Int64N(int64(50*time.Millisecond)))
				ctx, cancel := context.WithTimeout(context.Background(), d)
				start := time.Now()
				select {
				case <-p.stop:
					cancel()
					return
				case <-ctx.Done():
				}
				over := time.Since(start) - d
				cancel()
				p.mu.Lock()
				p.max = max(p.max, over)
				p.mu.Unlock()
			}
		})
	}
	return p
}

func (p *lagProbe) finish() time.Duration {
	close(p.stop)
	p.wg.Wait()
	return p.max
}

// TestChaosSoak runs many callers against four destinations with faults at
// the servers and in the codecs, stops the instance as the last messages are
// being sent, reads every destination back and checks what must never
// happen (see the package doc). It logs one "soak:" line of figures.
//
// Lateness is judged beyond lateGrace plus a slack for the lag a goroutine
// of this process has waking for a timer in the same run (lagProbe): on a
// machine with more runnable threads than cores that lag, not sinkbatch,
// dominates. The slack is twice the probe's worst for Deliver, whose callers
// wake far more often than the probe and so meet a worse tail (measured:
// probe 0.1–3.4 s, callers' worst 0–3.9 s), and three times for actor callers,
// whose answer takes two wake-ups (the batcher's timer, then the actor). Answers to
// actor callers whose entry was in a request at its deadline are counted
// (late_inflight) but not asserted: the batcher answers them when the request
// ends, which it bounds by the latest deadline of the batch, not by each
// entry's.
func TestChaosSoak(t *testing.T) {
	seed := *soakSeed
	began := time.Now()

	sqsFaults := &sqsFaults{Dice: newDice(seed, 1),
		ServerError: 0.03, Throttle: 0.03, ResetBefore: 0.02, ResetAfter: 0.01,
		Delay: 0.05, LongDelay: 0.01, DelayAfter: 0.4}
	psFaults := &pubsubFaults{Dice: newDice(seed, 2),
		Unavailable: 0.04, Delay: 0.05, LongDelay: 0.01, DelayAfter: 0.4}
	sqsEnv := newSQSEnv(t, sqsFaults, true)
	psEnv := newPubSubEnv(t, psFaults, true, topicOrdered, topicIdle)
	stdURL := sqsEnv.createQueue(t, "chaos-std", false)
	fifoURL := sqsEnv.createQueue(t, "chaos-fifo", true)

	chaos := func(c realCodec, stream uint64) *chaosCodec {
		return &chaosCodec{realCodec: c, Dice: newDice(seed, stream),
			SendPanicBefore: 0.004, SendPanicAfter: 0.003, SizePanic: 0.3}
	}
	stdTuning := codec.Tuning{Linger: 10 * time.Millisecond, MaxBytes: 8 << 10, MaxInflight: 6, QueueMax: 60, QueueMaxBytes: 16 << 10, TenantMax: 25, RetryAfterMax: 40 * time.Millisecond}
	fifoTuning := codec.Tuning{Linger: 5 * time.Millisecond, MaxBytes: 12 << 10, MaxInflight: 6, QueueMax: 60, QueueMaxBytes: 24 << 10, TenantMax: 25, RetryAfterMax: 40 * time.Millisecond}
	psTuning := codec.Tuning{MaxEntries: 50, MaxBytes: 12 << 10, Linger: 8 * time.Millisecond, MaxInflight: 16, QueueMax: 80, QueueMaxBytes: 24 << 10, TenantMax: 30, RetryAfterMax: 40 * time.Millisecond}
	idleTuning := codec.Tuning{MaxEntries: 20, MaxBytes: 32 << 10, Linger: 2 * time.Millisecond, IdleTimeout: 10 * time.Millisecond, MaxInflight: 2, QueueMax: 20, QueueMaxBytes: 64 << 10, TenantMax: 10, RetryAfterMax: 20 * time.Millisecond}
	std := &destination{name: "sqs-std", codec: chaos(sqsEnv.codec(t, stdURL, stdTuning), 3), tuning: stdTuning, grouped: 0.2, groups: 10,
		readBack: func() []stored { return sqsEnv.readBack(t, stdURL) }}
	fifo := &destination{name: "sqs-fifo", codec: chaos(sqsEnv.codec(t, fifoURL, fifoTuning), 4), tuning: fifoTuning, grouped: 1, groups: 40, ordered: true,
		readBack: func() []stored { return sqsEnv.readBack(t, fifoURL) }}
	ordered := &destination{name: "pubsub", codec: chaos(psEnv.codec(t, topicOrdered, psTuning), 5), tuning: psTuning, grouped: 0.7, groups: 40, ordered: true,
		readBack: func() []stored { return psEnv.readBack(topicOrdered) }}
	idle := &destination{name: "pubsub-idle", codec: chaos(psEnv.codec(t, topicIdle, idleTuning), 6), tuning: idleTuning,
		readBack: func() []stored { return psEnv.readBack(topicIdle) }}
	dests := []*destination{std, fifo, ordered, idle}
	var sumQueueMax int
	var sumQueueBytes int64
	var sumInflight int
	for _, d := range dests {
		sumQueueMax += d.tuning.QueueMax
		sumQueueBytes += d.tuning.QueueMaxBytes
		sumInflight += d.tuning.MaxInflight
	}

	logs := &logCounter{}
	system := testinst.System()
	// About 2,000 refusals: a chance of 1 in 300 crashes a few batchers
	// (1 in 2,000 left none in some runs, and the test asserts some).
	crashRec := &crashRecorder{Dice: newDice(seed, 7), Chance: 1.0 / 300}
	inst, err := actors.Start(system, actors.Config{Name: "chaos", Logger: slog.New(logs), Recorder: crashRec})
	require.NoError(t, err)
	t.Cleanup(func() {
		// Only if the test ended early: Stop has returned otherwise.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = inst.Stop(ctx)
		system.Shutdown()
	})
	s := &soak{seed: seed, inst: inst, system: system}

	for _, d := range dests {
		d.codec.On.Store(true)
	}
	sqsFaults.On.Store(true)
	psFaults.On.Store(true)
	crashRec.On.Store(true)
	bounds := sampleBounds(inst)
	lag := probeLag(seed)

	// The load: main workers share one stream of messages to the three busy
	// destinations; idle workers send to the fourth with pauses longer than
	// its IdleTimeout, so its batcher keeps stopping as deliveries arrive.
	var (
		next      atomic.Int64
		exhausted = make(chan struct{})
		once      sync.Once
		wg        sync.WaitGroup
		callers   []*callerActor
	)
	end := began.Add(*soakFor)
	more := func(i int) bool {
		if *soakFor > 0 {
			return time.Now().Before(end)
		}
		return i < *soakN
	}
	newWorker := func(n int) *worker {
		c := spawnCaller(system, inst)
		callers = append(callers, c)
		return &worker{s: s, rng: rand.New(rand.NewPCG(seed, uint64(1000+n))), caller: c}
	}
	for n := range mainWorkers {
		w := newWorker(n)
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if !more(i) {
					once.Do(func() { close(exhausted) })
					return
				}
				d := ordered
				switch x := rand.New(rand.NewPCG(seed, uint64(i))).Float64(); {
				case x < 0.3:
					d = std
				case x < 0.55:
					d = fifo
				}
				w.dispatch(s.message("m", i, d))
			}
		})
	}
	for n := range idleWorkers {
		w := newWorker(mainWorkers + n)
		wg.Go(func() {
			for i := n; i < 1<<30; i += idleWorkers {
				select {
				case <-exhausted:
					return
				default:
				}
				time.Sleep(time.Duration(w.rng.Int64N(int64(30 * time.Millisecond)))) // a pause longer than IdleTimeout, often
				w.dispatch(s.message("i", i, idle))
			}
		})
	}

	// Stop the instance as the last messages are still being sent: they
	// race it and end answered with ErrStopped.
	<-exhausted
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopBegan := time.Now()
	require.NoError(t, inst.Stop(stopCtx))
	stopTook := time.Since(stopBegan)
	wg.Wait()
	bounds.finish()
	slack := lag.finish()
	assert.Equal(t, actors.Stats{}, inst.Stats(), "Stop leaves nothing queued, in flight or running")
	for _, d := range dests {
		d.codec.On.Store(false)
	}
	crashRec.On.Store(false)

	// Stop answered everyone; the last answers may still be on their way
	// to the caller actors.
	assert.Eventually(t, func() bool {
		n := 0
		for _, c := range callers {
			n += c.unanswered()
		}
		return n == 0
	}, 10*time.Second, 5*time.Millisecond, "every actor caller is answered after Stop")
	for _, c := range callers {
		require.NoError(t, system.Root.StopFuture(c.pid).Wait())
	}
	// Lateness is judged beyond the scheduler's lag (see the test's doc).
	answers := answerStats{lateByKind: map[string]int{}}
	for _, c := range callers {
		c.stats(&answers, 3*slack)
	}
	lateDeliver, lateDeliverRaw := 0, len(s.deliverOver)
	var lateDeliverWorst time.Duration
	for _, over := range s.deliverOver {
		lateDeliverWorst = max(lateDeliverWorst, over.Round(time.Millisecond))
		if over > lateGrace+2*slack {
			lateDeliver++
		}
	}

	// Read every destination back and compare.
	f := &figures{outcomes: map[outcome]int{}}
	byDest := map[*destination][]*record{}
	for _, r := range s.records {
		f.outcomes[r.outcome]++
		byDest[r.dest] = append(byDest[r.dest], r)
		if r.outcome == permanent && !r.poison {
			f.misclassified++
			f.example("%s: %s answered permanent: %v", r.dest.name, r.key, r.lastErr)
		}
		if r.outcome == acked && r.poison {
			f.poisonAcked++
		}
	}
	for _, d := range dests {
		f.compare(d, d.readBack(), byDest[d])
	}
	var kinds []string
	s.kinds.Range(func(k, v any) bool {
		kinds = append(kinds, fmt.Sprintf("%s:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(kinds)
	var sizePanics, sendPanics int64
	for _, d := range dests {
		sizePanics += d.codec.SizePanics.Load()
		sendPanics += d.codec.SendPanics.Load()
	}
	t.Logf("attempt outcomes: %s", strings.Join(kinds, " "))
	t.Logf("faults: sqs 500=%d throttle=%d reset_before=%d reset_after=%d delay=%d long_delay=%d poison=%d; pubsub unavailable=%d delay=%d long_delay=%d poison=%d; codec size_panics=%d send_panics=%d",
		sqsFaults.Struck.ServerError.Load(), sqsFaults.Struck.Throttle.Load(), sqsFaults.Struck.ResetBefore.Load(), sqsFaults.Struck.ResetAfter.Load(),
		sqsFaults.Struck.Delay.Load(), sqsFaults.Struck.LongDelay.Load(), sqsFaults.Struck.Poison.Load(),
		psFaults.Struck.Unavailable.Load(), psFaults.Struck.Delay.Load(), psFaults.Struck.LongDelay.Load(), psFaults.Struck.Poison.Load(),
		sizePanics, sendPanics)
	t.Logf("late beyond %v + slack for a scheduler lag of %v: Deliver %d (of %d past %v, worst %v); actor answers for queued entries %d, for entries in a request %d (worst %v, by answer %v); stray answers %d; Stop took %v",
		lateGrace, slack.Round(time.Millisecond), lateDeliver, lateDeliverRaw, lateGrace, lateDeliverWorst,
		answers.lateQueued, answers.lateInFlight, answers.lateWorst, answers.lateByKind, answers.stray, stopTook.Round(time.Millisecond))
	for _, n := range answers.neverAnswered {
		t.Logf("never answered: %s", n)
	}
	crashes := logs.crashReasons()
	assert.Equal(t, logs.restarts.Load(), crashRec.Crashes.Load(), "every restart is a recorder panic")
	for _, c := range crashes {
		t.Logf("batcher crash not caused by the chaos codec: %s", c)
	}
	if u := logs.unexpected(); len(u) > 0 {
		t.Logf("other warnings: %q", u)
	}
	for _, e := range f.examples {
		t.Log(e)
	}
	t.Logf("soak: seed=%d messages=%d attempts=%d acked=%d permanent=%d gave_up=%d stopped=%d lost=%d wrong_id=%d dup_answers=%d unanswered=%d late=%d late_inflight=%d order_violations=%d misclassified=%d poison_acked=%d max_queued=%d/%d max_bytes=%d/%d max_inflight=%d/%d batcher_restarts=%d idle_stops=%d refusals=%d stored=%d server_dups=%d elapsed=%v",
		seed, len(s.records), s.attempts.Load(), f.outcomes[acked], f.outcomes[permanent], f.outcomes[gaveUp], f.outcomes[stopped],
		f.lost, f.wrongID, answers.twice, answers.never, lateDeliver+answers.lateQueued, answers.lateInFlight, f.orderViolations, f.misclassified, f.poisonAcked,
		bounds.maxQueued, sumQueueMax, bounds.maxBytes, sumQueueBytes, bounds.maxInFlight, sumInflight,
		logs.restarts.Load(), logs.idleStops.Load(), s.refusals.Load(), f.stored, f.dups, time.Since(began).Round(time.Millisecond))

	// Must be zero.
	assert.Zero(t, f.outcomes[inProgress], "messages without a final outcome")
	assert.Zero(t, f.lost, "acknowledged but absent at the server")
	assert.Zero(t, f.wrongID, "acknowledged with an id the server does not hold for the key")
	assert.Zero(t, answers.twice, "callers answered twice")
	assert.Zero(t, answers.never, "callers never answered")
	assert.Zero(t, answers.stray, "answers to a Ref nobody sent")
	assert.Zero(t, lateDeliver, "Deliver returned later than its deadline + %v + the scheduler's lag", lateGrace)
	assert.Zero(t, answers.lateQueued, "actor callers of queued entries answered later than their deadline + %v + the scheduler's lag", lateGrace)
	assert.Zero(t, f.orderViolations, "a group's causal order broken at the server")
	assert.Zero(t, f.misclassified, "valid messages answered with a permanent error")
	assert.Zero(t, f.poisonAcked, "poison messages acknowledged")
	assert.Zero(t, f.poisonStored, "poison messages stored")
	assert.Empty(t, crashes, "batcher crashes the chaos codec did not cause")
	assert.LessOrEqual(t, bounds.maxQueued, sumQueueMax, "Stats.Queued above the sum of QueueMax")
	assert.LessOrEqual(t, bounds.maxBytes, sumQueueBytes, "Stats.QueuedBytes above the sum of QueueMaxBytes")
	assert.LessOrEqual(t, bounds.maxInFlight, sumInflight, "Stats.InFlight above the sum of MaxInflight")
	assert.LessOrEqual(t, bounds.maxActive, len(dests), "more batchers than destinations")
	// The chaos happened.
	assert.Positive(t, logs.restarts.Load(), "no batcher crashed")
	assert.Positive(t, logs.idleStops.Load(), "no batcher stopped idle")
	assert.Positive(t, s.refusals.Load(), "no queue bound refused a delivery")
	assert.Positive(t, sendPanics, "no SendBatch panicked")
	for name, n := range map[string]int64{
		"SQS 500": sqsFaults.Struck.ServerError.Load(), "SQS throttling": sqsFaults.Struck.Throttle.Load(),
		"SQS reset": sqsFaults.Struck.ResetBefore.Load() + sqsFaults.Struck.ResetAfter.Load(), "SQS delay": sqsFaults.Struck.LongDelay.Load(),
		"SQS poison": sqsFaults.Struck.Poison.Load(), "Pub/Sub Unavailable": psFaults.Struck.Unavailable.Load(),
		"Pub/Sub delay": psFaults.Struck.LongDelay.Load(), "Pub/Sub poison": psFaults.Struck.Poison.Load(),
	} {
		assert.Positive(t, n, "no %s was injected", name)
	}
	if *soakFor == 0 {
		assert.GreaterOrEqual(t, len(s.records), *soakN, "too few messages")
	}
}

// figures are what the read back found.
type figures struct {
	outcomes                      map[outcome]int
	lost, wrongID, poisonAcked    int
	poisonStored, misclassified   int
	orderViolations, stored, dups int
	examples                      []string
}

func (f *figures) example(format string, args ...any) {
	if len(f.examples) < 10 {
		f.examples = append(f.examples, fmt.Sprintf(format, args...))
	}
}

// compare checks what d's server holds (got, in the server's order) against
// the records of the messages sent to d.
func (f *figures) compare(d *destination, got []stored, records []*record) {
	f.stored += len(got)
	ids := map[string]map[string]bool{} // idempotency key → the ids stored under it
	first := map[string]int{}           // idempotency key → position of its first copy
	for pos, m := range got {
		if strings.Contains(m.Body, poisonMark) {
			f.poisonStored++
		}
		if ids[m.Key] == nil {
			ids[m.Key] = map[string]bool{}
			first[m.Key] = pos
		} else {
			f.dups++ // at least once: a retry of a message whose answer was lost
		}
		ids[m.Key][m.ID] = true
	}
	groups := map[string][]*record{}
	for _, r := range records {
		if r.outcome == acked {
			switch {
			case ids[r.key] == nil:
				f.lost++
				f.example("%s: %s acknowledged as %s but absent", d.name, r.key, r.id)
			case !ids[r.key][r.id]:
				f.wrongID++
				f.example("%s: %s acknowledged as %s but stored as %v", d.name, r.key, r.id, ids[r.key])
			}
		}
		if _, ok := first[r.key]; ok && r.group != "" && d.ordered {
			groups[r.group] = append(groups[r.group], r)
		}
	}
	// Causality per group: a message acknowledged before another of its
	// group was first sent must reach the server first.
	for g, rs := range groups {
		sort.Slice(rs, func(i, j int) bool { return first[rs[i].key] < first[rs[j].key] })
		for i, later := range rs {
			for _, earlier := range rs[i+1:] {
				if earlier.outcome == acked && earlier.ackedAt < later.submitted {
					f.orderViolations++
					f.example("%s group %s: %s (acked at %d) stored after %s (sent at %d)", d.name, g, earlier.key, earlier.ackedAt, later.key, later.submitted)
				}
			}
		}
	}
}
