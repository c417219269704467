package adversary_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
	"github.com/ankusa/sinkbatch/messages"
)

var (
	flagDuration = flag.Duration("adversary.duration", 0, "run rounds for this long (default: the short run, about 12s of rounds)")
	flagSeed     = flag.Uint64("adversary.seed", 0, "seed of the first round (round i uses seed+i); 0: from the clock")
	flagRounds   = flag.Int("adversary.rounds", 0, "run exactly this many rounds, whatever the duration")
	flagSkip     = flag.String("adversary.skip", "", "comma-separated features to leave out: "+strings.Join(features, ","))
	flagSlack    = flag.Duration("adversary.slack", 2*time.Second, "how late past its bound an answer may come (a loaded machine)")
	flagUnfixed  = flag.Bool("adversary.unfixed", false, "also run the features and tests that find bugs main has not fixed yet (see unfixed)")
)

// unfixed are the features that find bugs main has not fixed yet, and the
// checks that fail because of them: the default run leaves them out, so that
// it finds the next bug rather than these again. Run with -adversary.unfixed
// to see them fail; delete an entry when its fix lands. A focused test of
// such a bug skips itself unless *flagUnfixed, the same way.
var unfixed = map[string]string{
	// An entry reads: "feature": "what it finds (the check that fails)".
	// None at present.
}

// features can each be left out with -adversary.skip, to look past a known
// failure for the next one.
var features = []string{
	"quiesce", "nilcodec", "typednil", "nilctx", "pastdeadline", "farfuture", "cancel", "abandon", "valuecodec", "manycodecs",
	"panicmeta", "panicsize", "panicvalidate", "panicsend", "negsize", "invalid", "refuse",
	"entryfail", "wholefail", "wrongcount", "ignorectx", "badtuning", "stopearly", "strict",
	"block", "adaptive", "nosender", "futures", "crash", "recpanic", "tracing", "listenpanic", "listenstep", "listensweep",
	"neverending", "pausemove",
}

// shortRun is the default run: short enough for CI under -race.
const shortRun = 12 * time.Second

// totals are the figures of a run, summed over its rounds.
type totals struct {
	rounds, failed, callers, calls, answered, acked int
	restarts, supRestarts, idleStops, requests      int
	excused                                         int
	crashes, recPanics, tracedRounds                int
	listenPanics                                    int
	spans                                           spanCounts
	worstStall                                      time.Duration
	outcomes                                        map[string]int
	kinds                                           map[string]uint64 // violation kind → first seed
}

func TestAdversary(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	skip := map[string]bool{}
	for _, f := range strings.Split(*flagSkip, ",") {
		if f = strings.TrimSpace(f); f != "" {
			require.Contains(t, features, f, "-adversary.skip: unknown feature")
			skip[f] = true
		}
	}
	if !*flagUnfixed {
		for f, why := range unfixed {
			if !skip[f] {
				skip[f] = true
				t.Logf("leaving out %s: %s", f, why)
			}
		}
	}
	budget := shortRun
	if *flagDuration > 0 {
		budget = *flagDuration
	}
	fmt.Printf("adversary: seed %d (replay a round: -adversary.seed=N -adversary.rounds=1)\n", seed)
	tot := totals{outcomes: map[string]int{}, kinds: map[string]uint64{}}
	end := time.Now().Add(budget)
	for i := 0; ; i++ {
		if *flagRounds > 0 {
			if i >= *flagRounds {
				break
			}
		} else if i > 0 && time.Now().After(end) {
			break
		}
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			r := newRound(t, s, skip, *flagSlack)
			r.run()
			r.report(&tot)
		})
	}
	var out []string
	for _, k := range sortedKeys(tot.outcomes) {
		out = append(out, fmt.Sprintf("%s %d", k, tot.outcomes[k]))
	}
	var kinds []string
	for _, k := range sortedKeys(tot.kinds) {
		kinds = append(kinds, fmt.Sprintf("%s(seed %d)", k, tot.kinds[k]))
	}
	line := fmt.Sprintf("adversary: seed %d: %d rounds (%d failed), %d callers, %d calls, %d answered, %d acked, %d requests, %d batcher restarts (%d panics in Recorder.Refused, %d in Listening), %d harmless Recorder panics, %d supervisor restarts, %d idle stops, %d traced rounds: %v, worst stall %v (%d late answers excused); %s; broken: [%s]",
		seed, tot.rounds, tot.failed, tot.callers, tot.calls, tot.answered, tot.acked, tot.requests,
		tot.restarts, tot.crashes, tot.listenPanics, tot.recPanics, tot.supRestarts, tot.idleStops, tot.tracedRounds, tot.spans, tot.worstStall, tot.excused, strings.Join(out, ", "), strings.Join(kinds, " "))
	fmt.Println(line)
	t.Log(line)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func newRound(t *testing.T, seed uint64, skip map[string]bool, slack time.Duration) *round {
	rng := rand.New(rand.NewPCG(seed, 0))
	r := &round{
		t: t, seed: seed, rng: rng, slack: slack, skip: skip,
		name:           fmt.Sprintf("adv%d", seed),
		defaultTimeout: time.Duration(50+rng.IntN(950)) * time.Millisecond,
		quiesce:        !skip["quiesce"] && rng.IntN(3) == 0,
		traffic:        time.Duration(200+rng.IntN(800)) * time.Millisecond,
		pFlag:          rng.Float64() * 0.15,
		byID:           map[uint64]*call{},
		byBody:         map[string]*call{},
		viol:           map[string]*violation{},
		logs:           &logCounter{counts: map[string]int{}},
		outcomes:       map[string]int{},
	}
	// Drawn from a stream of its own, so that the rest of a seed's
	// configuration is what it was before this draw existed.
	r.abandon = r.on("abandon") && r.on("cancel") && rand.New(rand.NewPCG(seed, 1)).IntN(4) == 0
	conc := 1 + rng.IntN(8)
	for i := range 1 + rng.IntN(4) {
		r.dests = append(r.dests, r.newDest(i, conc))
	}
	r.conc = conc
	r.drawTelemetry()
	r.listeners = r.drawListening()
	return r
}

// newDest draws a destination: limits, a tiny tuning, faults, codec values.
func (r *round) newDest(i, conc int) *dest {
	rng := r.rng
	d := &dest{
		r: r, idx: i,
		name:     fmt.Sprintf("adv%d", i),
		identity: fmt.Appendf(nil, "dest-%d-%d", r.seed, i),
		lim:      codec.Limits{MaxEntries: 1 + rng.IntN(10), MaxBytes: 96 + rng.IntN(1024), OneGroupPerRequest: rng.IntN(3) == 0},
		validate: rng.IntN(2) == 0,
		rng:      rand.New(rand.NewPCG(r.seed, uint64(100+i))),
		groups:   map[string]int{},
		stored:   map[string]int{},
		sent:     map[string]sendPos{},
	}
	t := &d.tune
	if rng.IntN(4) != 0 {
		t.MaxInflight = 1 + rng.IntN(4)
	}
	if rng.IntN(3) != 0 {
		t.MaxEntries = 1 + rng.IntN(d.lim.MaxEntries)
	}
	if rng.IntN(3) == 0 {
		t.MaxBytes = 64 + rng.IntN(d.lim.MaxBytes-64+1)
	}
	t.Linger = time.Duration(rng.IntN(3)) * time.Millisecond
	if rng.IntN(2) == 0 {
		t.QueueMax = 1 + rng.IntN(64)
	}
	maxBytes := cmpOr(t.MaxBytes, d.lim.MaxBytes)
	if rng.IntN(3) == 0 {
		t.QueueMaxBytes = int64(maxBytes * (1 + rng.IntN(8)))
	}
	if r.on("badtuning") && rng.IntN(20) == 0 {
		t.QueueMaxBytes = int64(maxBytes / 2) // Tuning.Check refuses it
		t.MaxBytes = maxBytes
	}
	if rng.IntN(3) == 0 {
		t.TenantMax = 1 + rng.IntN(8)
	}
	if rng.IntN(2) == 0 {
		t.RetryAfterMax = time.Duration(1+rng.IntN(10)) * time.Millisecond
	}
	if r.quiesce || rng.IntN(2) == 0 {
		t.IdleTimeout = time.Duration(1+rng.IntN(5)) * time.Millisecond
	}
	if r.on("block") && rng.IntN(5) == 0 {
		t.WhenFull = codec.Block
	}
	if r.on("strict") && rng.IntN(5) == 0 {
		t.StrictGroups = true
		t.GroupPauseMax = time.Duration(10+rng.IntN(90)) * time.Millisecond
	}
	if r.on("adaptive") && rng.IntN(5) == 0 {
		t.Adaptive = true
	}
	d.resolved = *t
	res := &d.resolved
	res.MaxInflight = cmpOr(res.MaxInflight, conc)
	res.MaxEntries = cmpOr(res.MaxEntries, d.lim.MaxEntries)
	res.MaxBytes = cmpOr(res.MaxBytes, d.lim.MaxBytes)
	res.QueueMax = cmpOr(res.QueueMax, codec.DefaultQueueMax)
	res.QueueMaxBytes = cmpOr(res.QueueMaxBytes, codec.DefaultQueueMaxBytes)

	f := &d.f
	f.latency = time.Duration(rng.IntN(4)) * time.Millisecond
	switch rng.IntN(7) {
	case 0: // healthy
	case 1:
		f.failWhole, f.throttle = 0.1, 0.05
	case 2:
		f.panicSend, f.panicMeta = 0.05, 0.01
	case 3:
		f.ignoreCtx, f.ignoreFor = 0.1, time.Duration(rng.IntN(200))*time.Millisecond
		f.latency = time.Duration(rng.IntN(20)) * time.Millisecond
	case 4:
		f.refuseWhole, f.permWhole = 0.1, 0.03
	case 5:
		f.wrongCount = 0.1
	default:
		f.failWhole, f.throttle, f.panicSend, f.panicMeta = 0.02, 0.02, 0.02, 0.002
		f.ignoreCtx, f.ignoreFor = 0.02, 50*time.Millisecond
		f.refuseWhole, f.permWhole, f.wrongCount = 0.02, 0.01, 0.02
	}
	if r.abandon {
		// A slow destination with a small queue: abandoned entries sit in
		// it long enough to be all that fills it.
		f.latency = time.Duration(100+rng.IntN(200)) * time.Millisecond
		if t.QueueMax == 0 {
			t.QueueMax = 1 + rng.IntN(16)
			res.QueueMax = t.QueueMax
		}
	}
	gate := func(p *float64, feature string) {
		if !r.on(feature) {
			*p = 0
		}
	}
	gate(&f.panicMeta, "panicmeta")
	gate(&f.panicSend, "panicsend")
	gate(&f.wrongCount, "wrongcount")
	gate(&f.ignoreCtx, "ignorectx")
	gate(&f.refuseWhole, "refuse")
	gate(&f.failWhole, "wholefail")
	gate(&f.permWhole, "wholefail")
	gate(&f.throttle, "wholefail")

	nPtr := 1 + rng.IntN(3)
	if r.on("manycodecs") && rng.IntN(10) == 0 {
		nPtr = 70 // past the codec values cached per destination
	}
	values := r.on("valuecodec") && rng.IntN(5) < 2
	if values && (rng.IntN(3) == 0 || r.abandon) {
		nPtr = 0 // value codecs only: no pointer's cancel can stand in for theirs
	}
	d.newValues(nPtr, values)
	return d
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// run drives the round: callers deliver until the traffic ends, Stop is
// called at a random moment, and everyone still waiting is given the slack
// to be answered.
func (r *round) run() {
	t := r.t
	rng := r.rng
	r.system = testinst.System()
	sub := r.system.EventStream.Subscribe(func(evt any) {
		if _, ok := evt.(*actor.SupervisorEvent); ok {
			r.supRest.Add(1)
		}
	})
	inst, err := actors.Start(r.system, r.config())
	require.NoError(t, err)
	r.inst = inst
	r.kill = make(chan struct{})
	var killCancel context.CancelFunc
	r.killCtx, killCancel = context.WithCancel(context.Background())
	r.start = time.Now()

	sampled := make(chan struct{})
	samplerDone, watchDone := make(chan struct{}), make(chan struct{})
	go r.sample(sampled, samplerDone)
	go r.stalls.watch(sampled, watchDone)

	var wg sync.WaitGroup
	goCallers, owners := 4+rng.IntN(28), 1+rng.IntN(6)
	actorDrivers, pipelined := 2+rng.IntN(12), rng.IntN(4)
	futures, noSenders := 0, 0
	if r.on("futures") {
		futures = rng.IntN(6)
	}
	if r.on("nosender") {
		noSenders = rng.IntN(2)
	}
	r.callers = goCallers + owners + actorDrivers + pipelined + futures + noSenders + r.listeners
	r.noSenders = noSenders
	var pids []*actor.PID
	for range 1 + rng.IntN(4) {
		pids = append(pids, r.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &callerActor{r: r} })))
	}
	spawn := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	for i := range goCallers + owners {
		spawn(func() { r.goroutineCaller(i, i >= goCallers) })
	}
	for i := range actorDrivers + pipelined {
		pid := pids[i%len(pids)]
		spawn(func() { r.actorCaller(i, pid, i >= actorDrivers) })
	}
	for i := range futures {
		spawn(func() { r.futureCaller(i) })
	}
	for i := range noSenders {
		spawn(func() { r.noSender(i) })
	}
	for i := range r.listeners {
		spawn(func() { r.listenCaller(i) })
	}
	if r.on("pausemove") && rng.IntN(2) == 0 {
		seed := rng.Uint64()
		spawn(func() { r.movePauses(seed) })
	}

	trafficEnd := r.start.Add(r.traffic)
	stopAt := r.start.Add(time.Duration(float64(r.traffic) * (0.3 + rng.Float64())))
	if r.quiesce {
		r.pauseUntil(trafficEnd)
		r.trafficEnd.Store(true)
		if !r.waitAnswered(time.Now().Add(10 * time.Second)) {
			r.violate("unanswered-quiesce", "callers still waiting 10s after the traffic ended (before Stop)")
		}
		r.trickle()
		r.checkIdle()
		stopAt = time.Now()
	}
	r.pauseUntil(stopAt)

	var stopTimeout time.Duration
	switch x := rng.IntN(10); {
	case x < 2 && r.on("stopearly"):
		stopTimeout = 0 // a ctx already over
	case x < 5 && r.on("stopearly"):
		stopTimeout = time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
	case x < 7:
		stopTimeout = 100 * time.Millisecond
	default:
		stopTimeout = 5 * time.Second
	}
	r.stopTimeout = stopTimeout
	if r.on("nilctx") && rng.IntN(4) == 0 {
		// Stop(nil) stops nothing: the real Stop below still drains (or
		// "stop-hangs" says it does not).
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.violate("nilctx-stop-panics", "Stop(nil) panicked: %v", p)
				}
			}()
			var nilCtx context.Context
			if err := inst.Stop(nilCtx); !errors.Is(err, actors.ErrNilContext) {
				r.violate("nilctx-stop", "Stop(nil) returned %v, not ErrNilContext", err)
			}
		}()
	}
	stopCtx, stopCancel := context.WithTimeout(context.Background(), stopTimeout)
	r.stopCalled.Store(time.Now().UnixNano())
	stopped := make(chan error, 1)
	go func() { stopped <- inst.Stop(stopCtx) }()
	second := make(chan struct{})
	if rng.IntN(4) == 0 {
		// A second Stop, with a ctx of its own: it waits for the first, or
		// returns when its own ctx ends.
		d := time.Duration(rng.Int64N(int64(200 * time.Millisecond)))
		go func() {
			defer close(second)
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			_ = inst.Stop(ctx)
			if took := time.Since(start); took > d+r.slack && took > stopTimeout+r.slack {
				r.violate("second-stop-late", "a second Stop with a %v ctx returned after %v (the first had %v)", d, took, stopTimeout)
			}
		}()
	} else {
		close(second)
	}
	select {
	case r.stopErr = <-stopped:
	case <-time.After(stopTimeout + r.slack + 5*time.Second):
		r.violate("stop-hangs", "Stop with a %v ctx has not returned %v after its ctx ended", stopTimeout, r.slack+5*time.Second)
	}
	stopCancel()
	<-second
	now := time.Now()
	r.stopReturned.Store(now.UnixNano())
	if r.stopErr == nil {
		for _, d := range r.dests {
			d.mu.Lock()
			if d.inflight > 0 {
				r.violate("stop-nil-with-requests", "Stop returned nil with %d requests of %s running", d.inflight, d.name)
			}
			d.mu.Unlock()
		}
	}

	r.pauseUntil(trafficEnd)
	r.trafficEnd.Store(true)
	r.waitAnswered(later(now, trafficEnd).Add(r.slack + 200*time.Millisecond))
	r.killedAt.Store(time.Now().UnixNano())
	close(r.kill)
	killCancel()
	wg.Wait()
	close(sampled)
	<-samplerDone
	<-watchDone

	deadline := time.Now().Add(r.slack)
	for inst.Stats() != (actors.Stats{}) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := inst.Stats(); s != (actors.Stats{}) {
		r.violate("stats-after-stop", "Stats %+v %v after Stop returned", s, r.slack)
	}
	for _, pid := range pids {
		_ = r.system.Root.StopFuture(pid).Wait()
	}
	r.system.EventStream.Unsubscribe(sub)
	r.unregisterListeners()
	r.system.Shutdown()
	r.check()
	r.checkTelemetry()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// pauseUntil waits until t; the round's own goroutine is not a caller.
func (r *round) pauseUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// waitAnswered waits until every call made so far is answered, or until.
func (r *round) waitAnswered(until time.Time) bool {
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	seen := 0
	for {
		r.mu.Lock()
		calls := slices.Clone(r.calls[seen:])
		r.mu.Unlock()
		if len(calls) == 0 {
			return true
		}
		for _, c := range calls {
			select {
			case <-c.over:
			case <-timer.C:
				return false
			}
		}
		seen += len(calls)
	}
}

// trickle sends, for a few tens of milliseconds, deliveries that are
// answered without being queued (too large), as the traffic of a destination
// that is otherwise idle.
func (r *round) trickle() {
	rng := rand.New(rand.NewPCG(r.seed, 5000))
	end := time.Now().Add(time.Duration(10+rng.IntN(40)) * time.Millisecond)
	for time.Now().Before(end) {
		d := r.dests[rng.IntN(len(r.dests))]
		c := r.newCall(rng, "trickle", d, "", 0, 0)
		big := make([]byte, d.resolved.MaxBytes+1)
		copy(big, c.msg.Body)
		for i := len(c.msg.Body); i < len(big); i++ {
			big[i] = 'x'
		}
		c.msg.Body = big
		r.goDeliver(rng, c)
		time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
	}
}

// checkIdle: with no traffic and every caller answered, every batcher must
// stop idle (IdleTimeout is a few milliseconds in quiescing rounds) and the
// queues be empty.
func (r *round) checkIdle() {
	longest := time.Duration(0)
	for _, d := range r.dests {
		longest = max(longest, d.f.ignoreFor+d.f.latency+d.tune.IdleTimeout)
	}
	deadline := time.Now().Add(longest + r.slack)
	for time.Now().Before(deadline) {
		if r.inst.Stats() == (actors.Stats{}) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	r.violate("idle-never-stops", "Stats %+v %v after the last caller was answered; IdleTimeout ≤ 5ms", r.inst.Stats(), longest+r.slack)
}

// sample reads Stats until stop and checks the bounds.
func (r *round) sample(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var maxQ, maxIn int
	var maxB int64
	for _, d := range r.dests {
		maxQ += d.resolved.QueueMax
		maxB += d.resolved.QueueMaxBytes
		maxIn += d.resolved.MaxInflight
	}
	tick := time.NewTicker(500 * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s := r.inst.Stats()
		if s.Batchers < 0 || s.Batchers > len(r.dests) || s.Queued < 0 || s.Queued > maxQ ||
			s.QueuedBytes < 0 || s.QueuedBytes > maxB || s.InFlight < 0 || s.InFlight > maxIn {
			r.violate("bound-stats", "Stats %+v beyond {Batchers:%d Queued:%d QueuedBytes:%d InFlight:%d}", s, len(r.dests), maxQ, maxB, maxIn)
		}
		m := &r.maxSeen
		m.Batchers, m.Queued = max(m.Batchers, s.Batchers), max(m.Queued, s.Queued)
		m.QueuedBytes, m.InFlight = max(m.QueuedBytes, s.QueuedBytes), max(m.InFlight, s.InFlight)
	}
}

// bound is when c must have been answered: by its deadline (or cancel), by
// Stop's return if that came first, and never before it was made; plus the
// slack.
func (c *call) bound() time.Time {
	b := c.effDeadline()
	if s := c.r.stopReturned.Load(); s != 0 {
		sr := later(time.Unix(0, s), c.start)
		if sr.Before(b) {
			b = sr
		}
	}
	return later(b, c.start).Add(c.r.slack)
}

// check goes through every call once the round is over.
func (r *round) check() {
	stopCalled := time.Unix(0, r.stopCalled.Load())
	killedAt := time.Unix(0, r.killedAt.Load())
	owners := map[string][]*call{}
	for _, c := range r.calls {
		c.mu.Lock()
		n, at, err, resID, panicked := c.n, c.at, c.err, c.resID, c.panicked
		c.mu.Unlock()
		if c.owner != "" {
			owners[c.owner] = append(owners[c.owner], c)
		}
		if panicked != nil {
			r.violate("deliver-panicked", "%s: Deliver panicked: %v", c.describe(), panicked)
			continue
		}
		// A Deliver the round's end cancelled was not answered; one made
		// just before that end may not have had its chance.
		killed := c.form == "deliver" && !at.Before(killedAt) && errors.Is(err, context.Canceled) && c.cancelAt.Load() == 0
		if killed && c.start.After(killedAt.Add(-r.slack)) {
			continue
		}
		if n == 0 || killed {
			r.violate("never-answered", "%s: no answer (Stop called %v into the round with a %v ctx: %v; returned %v later)",
				c.describe(), stopCalled.Sub(r.start), r.stopTimeout, r.stopErr, time.Unix(0, r.stopReturned.Load()).Sub(stopCalled))
			continue
		}
		r.answered++
		if n > 1 {
			r.violate("answered-twice", "%s: %d answers", c.describe(), n)
		}
		if b := c.bound(); at.After(b) {
			if stood := r.stalls.within(c.start, at); at.Sub(b) > stood {
				r.violate("late", "%s: answered %v after its bound (%v): %v", c.describe(), at.Sub(b), outcome(err), err)
			} else {
				r.excused++
			}
		}
		if sent := c.sentAt.Load(); sent != 0 {
			s := time.Unix(0, sent)
			if dl := c.deadline; !dl.IsZero() && s.After(dl.Add(r.slack)) && s.Sub(dl.Add(r.slack)) > r.stalls.within(dl, s) {
				r.violate("sent-after-deadline", "%s: sent %v after its deadline", c.describe(), s.Sub(dl))
			}
			if ca := c.cancelAt.Load(); ca != 0 {
				cancelled := time.Unix(0, ca)
				if s.After(cancelled.Add(r.slack)) && s.Sub(cancelled.Add(r.slack)) > r.stalls.within(cancelled, s) {
					r.violate("sent-after-cancel", "%s: sent %v after its caller cancelled", c.describe(), s.Sub(cancelled))
				}
			}
		}
		o := outcome(err)
		r.outcomes[o]++
		switch {
		case o == "stopped" && at.Before(stopCalled):
			r.violate("stopped-before-stop", "%s: ErrStopped %v before Stop was called", c.describe(), stopCalled.Sub(at))
		case o == "down" && !r.crashedBefore(c.d, at):
			r.violate("batcher-down", "%s: %v, and no batcher of its destination had crashed", c.describe(), err)
		case o == "expired" && c.cancelAt.Load() == 0 && c.dlClass != "nilctx":
			dl := c.deadline
			if dl.IsZero() {
				dl = c.start.Add(r.defaultTimeout)
			}
			if at.Before(dl.Add(-2 * time.Millisecond)) {
				r.violate("expired-early", "%s: %q %v before its deadline", c.describe(), err, dl.Sub(at))
			}
		case o == "other":
			r.violate("unclassified-error", "%s: %v (%T)", c.describe(), err, err)
		case o == "metapanic":
			r.violate("meta-panic-unwrapped", "%s: %q wraps neither codec.ErrCodecPanic nor a permanent error", c.describe(), err)
		case o == "config" && !codec.IsPermanent(err):
			r.violate("config-not-permanent", "%s: %q is not permanent (codec.IsPermanent), so a caller retries it forever", c.describe(), err)
		}
		if c.d == nil && o != "nilcodec" && o != "stopped" && o != "expired" && o != "cancelled" && c.dlClass != "nilctx" {
			r.violate("nilcodec-answer", "%s (typed nil %v): answered %q, want messages.ErrNilCodec", c.describe(), c.typedNil, err)
		}
		if o == "ok" {
			r.acked++
			if c.d == nil {
				continue
			}
			if _, ok := c.d.storedAt(c.body); !ok {
				r.violate("acked-not-stored", "%s: acknowledged with id %q but not in the codec's record", c.describe(), resID)
			}
			if resID != "id:"+c.body {
				r.violate("wrong-id", "%s: acknowledged with id %q, the codec gave it %q", c.describe(), resID, "id:"+c.body)
			}
		}
	}
	for owner, calls := range owners {
		r.checkOrder(owner, calls)
	}
	r.checkFull()
}

// sweepGrace is how long a caller that gave up may still hold room: a full
// queue is swept for callers it cannot see leave at most every 10ms (the
// batcher's fullSweepEvery), with a margin for a loaded machine.
const sweepGrace = 50 * time.Millisecond

// checkFull: a delivery refused for a full queue (RetryAfterError) must have
// found the bound reached by callers that still waited. A caller that had
// its answer, or gave up (cancelled, or its deadline passed), sweepGrace
// before the refused delivery was made holds no room: the batcher sweeps
// such entries before it refuses. Every other call to the destination made before the
// refusal is counted as holding room, which over-counts; deliveries nobody
// waits for hold room that no call shows, so rounds with them are not
// checked. A call answered at admission (refused, too large, no
// destination) or dead on arrival never held room. Up to 200 refusals a
// round are checked.
func (r *round) checkFull() {
	if r.noSenders > 0 {
		return
	}
	byDest := map[*dest][]*call{}
	var refused []*call
	for _, c := range r.calls {
		if c.d == nil {
			continue
		}
		byDest[c.d] = append(byDest[c.d], c)
		c.mu.Lock()
		full := c.n > 0 && outcome(c.err) == "full"
		c.mu.Unlock()
		if full {
			refused = append(refused, c)
		}
	}
	r.rng.Shuffle(len(refused), func(i, j int) { refused[i], refused[j] = refused[j], refused[i] })
	for _, f := range refused[:min(len(refused), 200)] {
		var ra *messages.RetryAfterError
		errors.As(f.err, &ra)
		live, tenant, bytes := 0, 0, int64(counted(f.msg))
		for _, c := range byDest[f.d] {
			if c == f || !c.start.Before(f.at) {
				continue
			}
			c.mu.Lock()
			gone := c.n > 0 && (c.at.Before(f.start.Add(-sweepGrace)) || neverQueued(c.err))
			c.mu.Unlock()
			if gone || c.dlClass == "past" {
				continue
			}
			live++
			bytes += int64(counted(c.msg))
			if c.msg.Tenant == f.msg.Tenant {
				tenant++
			}
		}
		t := f.d.resolved
		var room bool
		switch ra.Reason {
		case messages.FullEntries:
			room = live < t.QueueMax
		case messages.FullBytes:
			room = bytes <= t.QueueMaxBytes
		case messages.FullTenant:
			room = t.TenantMax > 0 && tenant < t.TenantMax
		}
		if room {
			r.violate("full-with-room", "%s: refused %v while at most %d callers of the destination still waited (%d of its tenant, %d bytes with it); QueueMax %d, QueueMaxBytes %d, TenantMax %d",
				f.describe(), ra, live, tenant, bytes, t.QueueMax, t.QueueMaxBytes, t.TenantMax)
		}
	}
}

// neverQueued says whether err answers a delivery at admission, before it
// could hold room: refused for fullness, too large, no destination.
func neverQueued(err error) bool {
	switch outcome(err) {
	case "full", "toolarge", "nilcodec", "metapanic", "config":
		return true
	}
	return false
}

// checkOrder: an owner's attempts reach the codec in the order it made them,
// and its acknowledged messages are stored in that order.
func (r *round) checkOrder(owner string, calls []*call) {
	sort.Slice(calls, func(i, j int) bool { return calls[i].ownerSeq < calls[j].ownerSeq })
	var last *call
	var lastPos sendPos
	for _, c := range calls {
		p, ok := c.d.sentAt(c.body)
		if !ok {
			continue
		}
		if last != nil && (p.call < lastPos.call || p.call == lastPos.call && p.index < lastPos.index) {
			r.violate("send-order", "group %s: attempt %d (call %d) sent in request %d before attempt %d (call %d) in request %d",
				owner, c.ownerSeq, c.id, p.call, last.ownerSeq, last.id, lastPos.call)
		}
		last, lastPos = c, p
	}
	last, lastStored := nil, -1
	for _, c := range calls {
		c.mu.Lock()
		acked := c.n > 0 && c.err == nil
		c.mu.Unlock()
		if !acked {
			continue
		}
		p, ok := c.d.storedAt(c.body)
		if !ok {
			continue
		}
		if last != nil && p < lastStored {
			r.violate("store-order", "group %s: message %d (call %d) stored before message %d (call %d), both acknowledged",
				owner, c.logical, c.id, last.logical, last.id)
		}
		last, lastStored = c, p
	}
}

// report fails the round for each kind of broken promise, with examples and
// the seed to replay it, and adds the round's figures to tot.
func (r *round) report(tot *totals) {
	t := r.t
	// A request goroutine may still run if Stop returned an error (its ctx
	// is cancelled; begin checks that it is): read under the locks it takes.
	requests := 0
	for _, d := range r.dests {
		d.mu.Lock()
		requests += d.requests
		d.mu.Unlock()
	}
	r.vmu.Lock()
	r.reported = true
	r.vmu.Unlock()
	restarts := r.logs.count("sinkbatch: batcher crashed; restarting it")
	idle := r.logs.count("sinkbatch: batcher stopped idle")
	t.Logf("round %d: %d dests, %d callers, %d calls, %d answered, %d acked, %d requests, %d restarts (%d panics in Refused, %d in Listening), %d harmless Recorder panics, %d supervisor restarts, %d idle stops, quiesce %v, abandon %v, sampler %q: %v, Stop(%v) = %v, max %+v, outcomes %v; worst stall %v, late answers excused by stalls %d",
		r.seed, len(r.dests), r.callers, len(r.calls), r.answered, r.acked, requests, restarts, r.crashes, r.listenPanics, r.recPanics, r.supRest.Load(), idle,
		r.quiesce, r.abandon, r.sampler, r.spans, r.stopTimeout, r.stopErr, r.maxSeen, r.outcomes, r.stalls.worst(), r.excused)
	tot.crashes += r.crashes
	tot.listenPanics += r.listenPanics
	tot.recPanics += r.recPanics
	if r.tp != nil {
		tot.tracedRounds++
		tot.spans.all += r.spans.all
		tot.spans.create += r.spans.create
		tot.spans.recorded += r.spans.recorded
	}
	tot.worstStall = max(tot.worstStall, r.stalls.worst())
	tot.excused += r.excused
	tot.rounds++
	tot.callers += r.callers
	tot.calls += len(r.calls)
	tot.answered += r.answered
	tot.acked += r.acked
	tot.requests += requests
	tot.restarts += restarts
	tot.supRestarts += int(r.supRest.Load())
	tot.idleStops += idle
	for k, v := range r.outcomes {
		tot.outcomes[k] += v
	}
	if len(r.viol) == 0 {
		return
	}
	tot.failed++
	for _, d := range r.dests {
		t.Logf("dest %s: limits %+v tuning %+v validate %v faults %+v values %d", d.name, d.lim, d.tune, d.validate, d.f, len(d.values))
	}
	for _, kind := range sortedKeys(r.viol) {
		v := r.viol[kind]
		if _, ok := tot.kinds[kind]; !ok {
			tot.kinds[kind] = r.seed
		}
		t.Errorf("%s: %d times, e.g.\n\t%s", kind, v.n, strings.Join(v.examples, "\n\t"))
	}
	t.Logf("replay: go test -race ./internal/adversary/ -run TestAdversary -adversary.seed=%d -adversary.rounds=1 -v", r.seed)
}
