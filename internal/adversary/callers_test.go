package adversary_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/messages"
)

// pause waits d or until the round is killed; it reports false if killed.
func (r *round) pause(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.kill:
		return false
	}
}

// gap is the pause between two of a caller's deliveries: mostly none, now
// and then long enough for a batcher to go idle.
func (r *round) gap(rng *rand.Rand) time.Duration {
	switch x := rng.IntN(100); {
	case x < 70:
		return 0
	case x < 95:
		return time.Duration(rng.IntN(3)) * time.Millisecond
	default:
		return time.Duration(5+rng.IntN(30)) * time.Millisecond
	}
}

// backoff is how long an owner waits before trying err's message again.
func backoff(rng *rand.Rand, err error) time.Duration {
	var ra *messages.RetryAfterError
	if errors.As(err, &ra) {
		return min(ra.After, 20*time.Millisecond)
	}
	return time.Duration(rng.IntN(3)) * time.Millisecond
}

// goroutineCaller calls Deliver or DeliverResult in a loop. An owner owns
// its group on one destination: it delivers its messages one after another
// and tries each up to three times while the answer is retryable.
func (r *round) goroutineCaller(idx int, owner bool) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(1000+idx)))
	group := ""
	var fixed *dest
	if owner {
		group = fmt.Sprintf("o%d", idx)
		fixed = r.dests[rng.IntN(len(r.dests))]
	}
	seq := 0
	for logical := 0; !r.trafficEnd.Load(); logical++ {
		for attempt := 0; attempt < 3; attempt++ {
			d := fixed
			if d == nil {
				d = r.pickDest(rng)
			}
			seq++
			c := r.newCall(rng, "deliver", d, group, seq, logical)
			err := r.goDeliver(rng, c)
			if !owner || !retryable(err) || r.trafficEnd.Load() || !r.pause(backoff(rng, err)) {
				break
			}
		}
		if !r.pause(r.gap(rng)) {
			return
		}
	}
}

// pickDest picks a destination, or nil (a nil codec) now and then.
func (r *round) pickDest(rng *rand.Rand) *dest {
	if (r.on("nilcodec") || r.on("typednil")) && rng.IntN(100) == 0 {
		return nil
	}
	return r.dests[rng.IntN(len(r.dests))]
}

// goDeliver makes c's delivery with Instance.Deliver: with a ctx that has
// c's deadline (or none), cancelled at a random moment now and then, or a
// nil ctx.
func (r *round) goDeliver(rng *rand.Rand, c *call) error {
	// In an abandoning round, half the calls give up within a few
	// milliseconds of a deadline an hour away: their entries hold room
	// until a sweep finds them, which only a reported cancel or the
	// periodic sweep of a full queue does.
	abandon := r.abandon && r.on("cancel") && rng.IntN(2) == 0
	if abandon {
		c.deadline, c.dlClass = time.Now().Add(time.Hour), "abandon"
	}
	ctx := r.killCtx
	var cancel context.CancelFunc
	// A third of the no-deadline calls (chosen by id) have a ctx that
	// never ends:
	// Deliver waits on its answer alone, DefaultTimeout is its reply
	// process's timer, and the round's end does not kill the call.
	neverending := c.deadline.IsZero() && r.on("neverending") && c.id%3 == 0
	switch {
	case neverending:
		ctx, cancel = context.Background(), func() {}
		c.dlClass = "neverending"
	case c.deadline.IsZero():
		ctx, cancel = context.WithCancel(ctx)
	default:
		ctx, cancel = context.WithDeadline(ctx, c.deadline)
	}
	defer cancel()
	if !neverending && (abandon || r.on("cancel") && rng.IntN(100) < 12) {
		// Some cancels land as the answer does: Deliver then sees both.
		after := time.Duration(rng.Int64N(int64(30 * time.Millisecond)))
		switch {
		case abandon:
			after = time.Duration(1+rng.IntN(5)) * time.Millisecond
		case rng.IntN(3) == 0:
			after = time.Duration(rng.Int64N(int64(100 * time.Microsecond)))
		}
		t := time.AfterFunc(after, func() {
			c.cancelAt.Store(time.Now().UnixNano())
			cancel()
		})
		defer t.Stop()
	}
	if c.parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, c.parent)
	}
	if r.on("nilctx") && rng.IntN(200) == 0 {
		ctx = nil //nolint:staticcheck // a nil ctx is what this call tries
		c.dlClass = "nilctx"
	}
	useResult := rng.IntN(2) == 0
	var (
		id  string
		err error
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				c.mu.Lock()
				c.panicked = p
				c.mu.Unlock()
				err = fmt.Errorf("adversary: Deliver panicked: %v", p)
			}
		}()
		if useResult {
			rr, e := r.inst.DeliverResult(ctx, c.codecVal, c.msg)
			id, err = rr.ID, e
			if e == nil && rr.Err != nil {
				r.violate("result-err", "%s: DeliverResult returned a nil error and Result.Err %v", c.describe(), rr.Err)
			}
		} else {
			id, err = r.inst.Deliver(ctx, c.codecVal, c.msg)
		}
	}()
	c.answer(time.Now(), id, err)
	return err
}

// callerActor delivers with ctx.Request to the instance's PID and counts
// the *messages.Delivered each call gets.
type callerActor struct{ r *round }

// send asks a caller actor to deliver calls in order, in one Receive.
type send struct{ calls []*call }

func (a *callerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *send:
		for _, c := range m.calls {
			ctx.Request(a.r.inst.PID(), a.r.deliverMsg(c))
		}
	case *messages.Delivered:
		a.r.delivered(m)
	}
}

func (r *round) deliverMsg(c *call) *messages.Deliver {
	return &messages.Deliver{Codec: c.codecVal, Message: c.msg, Deadline: c.deadline, Ref: c.id, SpanContext: c.parent}
}

// delivered takes an answer for an actor caller.
func (r *round) delivered(m *messages.Delivered) {
	now := time.Now()
	id, ok := m.Ref.(uint64)
	var c *call
	if ok {
		c = r.callByID(id)
	}
	if c == nil {
		r.stray.Add(1)
		r.violate("stray-answer", "an answer with Ref %v (%T) that no call was sent with: %v", m.Ref, m.Ref, m.Err)
		return
	}
	c.answer(now, m.ID, m.Err)
}

// actorCaller drives a caller actor: single deliveries, or, for a pipelined
// owner, bursts of its group's messages sent in order in one Receive, so
// they reach the batcher in that order.
func (r *round) actorCaller(idx int, pid *actor.PID, pipelined bool) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(2000+idx)))
	group := ""
	var fixed *dest
	if pipelined {
		group = fmt.Sprintf("p%d", idx)
		fixed = r.dests[rng.IntN(len(r.dests))]
	}
	seq := 0
	for !r.trafficEnd.Load() {
		var calls []*call
		n := 1
		if pipelined {
			n = 1 + rng.IntN(5)
		}
		for range n {
			d := fixed
			if d == nil {
				d = r.pickDest(rng)
			}
			seq++
			form := "actor"
			if pipelined {
				form = "pipelined"
			}
			calls = append(calls, r.newCall(rng, form, d, group, seq, seq))
		}
		r.system.Root.Send(pid, &send{calls: calls})
		for _, c := range calls {
			select {
			case <-c.done:
			case <-r.kill:
				return
			}
		}
		if !r.pause(r.gap(rng)) {
			return
		}
	}
}

// futureCaller delivers with Root.RequestFuture. Its future waits until
// the call's deadline plus the slack; the round's end stops it.
func (r *round) futureCaller(idx int) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(3000+idx)))
	for !r.trafficEnd.Load() {
		c := r.newCall(rng, "future", r.pickDest(rng), "", 0, 0)
		wait := min(max(time.Until(c.effDeadline()), 0)+r.slack, time.Minute)
		f := r.system.Root.RequestFuture(r.inst.PID(), r.deliverMsg(c), wait)
		fin := make(chan struct{})
		go func() {
			select {
			case <-r.kill:
				r.system.Root.Stop(f.PID())
			case <-fin:
			}
		}()
		res, err := f.Result()
		close(fin)
		c.finish()
		if d, ok := res.(*messages.Delivered); ok && err == nil {
			if d.Ref != c.id {
				r.violate("wrong-ref", "%s: answered with Ref %v", c.describe(), d.Ref)
			}
			c.answer(time.Now(), d.ID, d.Err)
		}
		if !r.pause(r.gap(rng)) {
			return
		}
	}
}

// noSender sends deliveries nobody waits for, as Root.Send does.
func (r *round) noSender(idx int) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(4000+idx)))
	for !r.trafficEnd.Load() {
		d := r.dests[rng.IntN(len(r.dests))]
		c := &call{r: r, id: r.nextID.Add(1)}
		c.deadline, _ = r.deadline(rng, false)
		c.msg = r.message(rng, c, d, "")
		r.system.Root.Send(r.inst.PID(), &messages.Deliver{Codec: d.values[rng.IntN(len(d.values))], Message: c.msg, Deadline: c.deadline})
		if !r.pause(time.Duration(rng.IntN(5)) * time.Millisecond) {
			return
		}
	}
}
