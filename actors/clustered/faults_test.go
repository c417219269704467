//go:build !race

package clustered_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// faultLedger records what the destinations did with each message, by
// body, whichever member's codec sent it: the outcome each request gave
// it ("ok", "retry", "perm", "throttle", "whole", "panic").
type faultLedger struct {
	mu       sync.Mutex
	outcomes map[string][]string
	at       map[string]time.Time // when its request reached the codec
	requests []faultRequest
}

// faultRequest is one request a codec took: when, and its messages.
type faultRequest struct {
	member   int // the member whose codec took it, in start order
	dest     string
	at       time.Time
	messages []codec.Message
	outcomes []string
}

func (f *faultLedger) record(member int, dest string, batch []codec.Message, outcomes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	for i, m := range batch {
		f.outcomes[string(m.Body)] = append(f.outcomes[string(m.Body)], outcomes[i])
		f.at[string(m.Body)] = now
	}
	f.requests = append(f.requests, faultRequest{member: member, dest: dest, at: now, messages: append([]codec.Message(nil), batch...), outcomes: outcomes})
}

func (f *faultLedger) sentAt(body string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.at[body]
}

func (f *faultLedger) of(body string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outcomes[body]
}

// faultCodec is a destination whose requests take 2-12 ms and whose
// messages say, in their body's last field, what becomes of them: "ok",
// "retry" (a retryable entry error), "perm" (a permanent one), "throttle"
// (an entry throttled), "whole" (the whole request fails with an entry
// error of code Whole) or "panic" (SendBatch panics). A message accepted
// gets the id "id:" + its body, so an answer's id says whose it is.
func faultCodec(member int, name string, ledger *faultLedger, tune codec.Tuning) codec.Codec {
	c := fakecodec.New(name, codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Latency, c.Jitter, c.Discard, c.Tune = 7*time.Millisecond, 5*time.Millisecond, true, tune
	c.Hook = func(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
		whole := ""
		for _, m := range batch {
			switch what := directive(m); what {
			case "panic", "whole":
				if whole != "panic" {
					whole = what
				}
			}
		}
		outcomes := make([]string, len(batch))
		if whole != "" {
			for i := range batch {
				outcomes[i] = whole
			}
			ledger.record(member, name, batch, outcomes)
			if whole == "panic" {
				panic("faultCodec: a message asked for a panic")
			}
			return nil, &codec.EntryError{Code: "Whole", Message: "the request failed as a whole"}
		}
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			what := directive(m)
			outcomes[i] = what
			switch what {
			case "retry":
				res[i].Err = &codec.EntryError{Code: "Retry", Message: "try again"}
			case "perm":
				res[i].Err = &codec.EntryError{Code: "Perm", Message: "never", Permanent: true}
			case "throttle":
				res[i].Err = &codec.EntryError{Code: "Throttle", Message: "slow down", Throttled: true}
			default:
				res[i].ID = "id:" + string(m.Body)
			}
		}
		ledger.record(member, name, batch, outcomes)
		return res, nil
	}
	return c
}

// groupOf is the group of the message whose body is body: its caller's
// number (the body's second field, "c<n>") mod 5.
func groupOf(body string) string {
	var caller int
	fmt.Sscanf(strings.Split(body, "/")[1], "c%d", &caller)
	return fmt.Sprintf("g%d", caller%5)
}

// deadlineSlack is how long after its caller's deadline a message may
// still be sent: the time its batch took to travel to the owner, on a
// loaded machine.
const deadlineSlack = 250 * time.Millisecond

// directive is what m's body asks of the destination: its last field.
func directive(m codec.Message) string {
	b := string(m.Body)
	return b[strings.LastIndexByte(b, '/')+1:]
}

// Every delivery, through the cluster, is answered with its own message's
// result while destinations fail in every way a codec can (entry errors,
// throttling, whole-request failures, panics), callers give up early, and
// a fourth member joins and leaves. Callers on three members deliver, with
// Node.Deliver and with the actor form (*Deliver to Node.PID, answered by
// one *messages.Delivered). Each answer is checked against what the
// destination did with that message:
//   - an id is "id:" + the message's own body, and the destination
//     accepted the message exactly once;
//   - an error matches what the destination said of the message (the same
//     entry error's code and permanence, ErrThrottled, ErrCodecPanic, or
//     the whole request's error);
//   - a message the destination never saw is answered with an error that
//     says it was not sent, or may not have been (ErrUnreachable, the
//     caller's ctx, ErrStopped, a RetryAfterError);
//   - no message reaches a destination twice (nothing here retries), and
//     each actor-form delivery is answered exactly once.
func TestEveryAnswerIsTheMessagesOwnUnderFaultsAndChurn(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	var rngMu sync.Mutex
	random := func(n int) int {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(n)
	}

	ledger := &faultLedger{outcomes: map[string][]string{}, at: map[string]time.Time{}}
	dests := names(6)
	// Each destination's flow: the default, strict groups, blocking on a
	// small queue, adaptive in-flight, refusing on a small queue, and all
	// three together.
	tunings := map[string]codec.Tuning{
		"dest-0": {},
		"dest-1": {StrictGroups: true},
		"dest-2": {WhenFull: codec.Block, QueueMax: 16},
		"dest-3": {Adaptive: true, MaxInflight: 8},
		"dest-4": {QueueMax: 8},
		"dest-5": {StrictGroups: true, WhenFull: codec.Block, QueueMax: 16, Adaptive: true, MaxInflight: 8},
	}
	agent := test.NewInMemAgent()
	started := 0 // members started: the member a codec is made for
	o := memberOpts{codec: func(name string) codec.Codec { return faultCodec(started, name, ledger, tunings[name]) }, noCleanup: true}
	start := func() *member {
		started++
		o := o
		o.provider = test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
		return startMember(t, dests, o)
	}
	ms := []*member{start(), start(), start()}
	var all []*member
	all = append(all, ms...)
	var allMu sync.Mutex
	t.Cleanup(func() {
		allMu.Lock()
		defer allMu.Unlock()
		leaveAll(t, all)
	})
	waitMembers(t, ms, 3)

	type answer struct {
		body, dest, from string
		id               string
		err              error
		actor            bool
		gaveUp           time.Time // when the caller's ctx ended, if it did
	}
	var mu sync.Mutex
	var answers []answer
	actorAnswers := map[string]int{} // body → Delivered received
	// A message's fate: most are accepted; a request holding a "whole" or
	// "panic" message fails as a whole, so those are rare.
	fate := func() string {
		switch r := random(200); {
		case r < 2:
			return "panic"
		case r < 4:
			return "whole"
		case r < 14:
			return "retry"
		case r < 24:
			return "perm"
		case r < 34:
			return "throttle"
		}
		return "ok"
	}

	// One collector actor per member takes the actor form's answers.
	collectors := make([]*actor.PID, len(ms))
	for i, m := range ms {
		collectors[i] = m.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if d, ok := c.Message().(*messages.Delivered); ok {
				body := d.Ref.(string)
				mu.Lock()
				actorAnswers[body]++
				if actorAnswers[body] == 1 {
					answers = append(answers, answer{body: body, dest: strings.Split(body, "/")[0], from: m.system.Address(), id: d.ID, err: d.Err, actor: true})
				}
				mu.Unlock()
			}
		}))
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var actorSent atomic.Int64
	for ci := range 90 {
		m, mi := ms[ci%len(ms)], ci%len(ms)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				dest := dests[random(len(dests))]
				key := fmt.Sprintf("%s/c%d/%d", dest, ci, seq)
				body := fmt.Sprintf("%s.0/%s", key, fate())
				msg := codec.Message{Tenant: fmt.Sprintf("t%d", ci%4), Group: fmt.Sprintf("g%d", ci%5), IdempotencyKey: key, Body: []byte(body)}
				deadline := time.Duration(200+random(2800)) * time.Millisecond
				if random(4) == 0 {
					// The actor form: fire, and take the answer in the collector.
					actorSent.Add(1)
					m.system.Root.RequestWithCustomSender(m.node.PID(), &clustered.Deliver{Destination: dest, Message: msg, Deadline: time.Now().Add(deadline), Ref: body}, collectors[mi])
					time.Sleep(time.Duration(random(5)) * time.Millisecond)
					continue
				}
				// A message of a strict destination that failed retryably
				// is retried (up to twice, to be accepted), with its key:
				// the retry resumes its group.
				for attempt := 1; ; attempt++ {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					if random(8) == 0 {
						// A caller that gives up early.
						time.AfterFunc(time.Duration(random(30))*time.Millisecond, cancel)
					}
					id, err := m.node.Deliver(ctx, dest, msg)
					var gaveUp time.Time
					if ctx.Err() != nil {
						gaveUp = time.Now()
					}
					cancel()
					mu.Lock()
					answers = append(answers, answer{body: body, dest: dest, from: m.system.Address(), id: id, err: err, gaveUp: gaveUp})
					mu.Unlock()
					var entry *codec.EntryError
					retryable := errors.Is(err, codec.ErrCodecPanic) || (errors.As(err, &entry) && !entry.Permanent)
					if !tunings[dest].StrictGroups || !retryable || attempt > 2 {
						break
					}
					body = fmt.Sprintf("%s.%d/ok", key, attempt)
					msg.Body = []byte(body)
				}
			}
		}()
	}

	// A fourth member joins, and later leaves, while the callers run.
	time.Sleep(1500 * time.Millisecond)
	joinAt := time.Now()
	fourth := start()
	joinedAt := time.Now()
	allMu.Lock()
	all = append(all, fourth)
	allMu.Unlock()
	waitMembers(t, append(ms, fourth), 4)
	time.Sleep(1500 * time.Millisecond)
	leaveAt := time.Now()
	fourth.leave(t)
	leftAt := time.Now()
	waitMembers(t, ms, 3)
	time.Sleep(1000 * time.Millisecond)
	close(stop)
	wg.Wait()

	// Every actor-form delivery is answered within its deadline (at most 3 s).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(actorAnswers)) == actorSent.Load()
	}, 5*time.Second, 50*time.Millisecond, "actor-form deliveries left unanswered")

	mu.Lock()
	defer mu.Unlock()
	kinds := map[string]int{}
	for body, n := range actorAnswers {
		assert.Equal(t, 1, n, "%s: the actor form was answered %d times", body, n)
	}
	for _, a := range answers {
		outcomes := ledger.of(a.body)
		assert.LessOrEqual(t, len(outcomes), 1, "%s reached a destination %d times: %v", a.body, len(outcomes), outcomes)
		kind := checkFaultAnswer(t, a.body, a.id, a.err, outcomes)
		kinds[kind]++
		if kind == "ctx-after-send" && !a.gaveUp.IsZero() {
			// A request begins, at the latest, 12 ms (the codec's latency)
			// before the codec records it.
			late := ledger.sentAt(a.body).Add(-12 * time.Millisecond).Sub(a.gaveUp)
			switch {
			case errors.Is(a.err, context.Canceled) && late > 0:
				// Sent while the cancel travelled to the owner (or, as
				// the latency subtracted is the most a request takes,
				// before): the answer says it may have been.
				kinds["cancelled-then-sent"]++
				assert.ErrorIs(t, a.err, clustered.ErrUnreachable, "%s: cancelled and sent later, but the answer does not say it may have been sent", a.body)
			case errors.Is(a.err, context.DeadlineExceeded) && late > deadlineSlack:
				assert.Fail(t, "sent after its caller's deadline", "%s: sent %v after its caller's deadline passed: %v", a.body, late, a.err)
			}
		}
	}
	// StrictGroups: once a request fails messages of a group retryably,
	// the group's next message sent is the retry of one of them (its key),
	// which resumes the group if accepted (GroupPauseMax, 30 s, is longer
	// than the test), across the fourth member's join and leave too.
	// A retry whose caller stopped waiting may have reached the owner,
	// resumed the group and then been dropped unsent: after the pauses it
	// could end, the group's next message is not checked.
	mayResume := map[string]bool{}
	for _, a := range answers {
		key, attempt, _ := strings.Cut(a.body[:strings.LastIndexByte(a.body, '/')], ".")
		if attempt != "0" && a.err != nil && (errors.Is(a.err, clustered.ErrUnreachable) || errors.Is(a.err, context.Canceled) || errors.Is(a.err, context.DeadlineExceeded)) {
			mayResume[key] = true
		}
	}
	unchecked := 0
	ledger.mu.Lock()
	pausedBy := map[string]map[string]bool{} // dest/group → the keys whose retry may resume it
	pausedAt := map[string]faultRequest{}
	since := func(at time.Time) time.Duration { return at.Sub(joinAt) }
	strictSent, pauses, resumes := 0, 0, 0
	for _, r := range ledger.requests {
		if !tunings[r.dest].StrictGroups {
			continue
		}
		failed := map[string]map[string]bool{}
		for i, m := range r.messages {
			k := r.dest + "/" + m.Group
			strictSent++
			if keys := pausedBy[k]; keys != nil {
				if !keys[m.IdempotencyKey] {
					p := pausedAt[k]
					for _, a := range answers {
						for key := range keys {
							if strings.HasPrefix(a.body, key+".") {
								t.Logf("  %s: answered %q %v, gave up %v", a.body, a.id, a.err, !a.gaveUp.IsZero())
							}
						}
					}
					assert.Fail(t, "a paused group was sent", "%s: %s sent by member %d at %v (from the join) while the group waited for the retry of one of %v, paused at %v by %v on member %d; join %v-%v, leave %v-%v",
						k, m.Body, r.member, since(r.at), keys, since(p.at), p.outcomes, p.member, since(joinAt), since(joinedAt), since(leaveAt), since(leftAt))
				}
				delete(pausedBy, k)
				resumes++
			}
			if o := r.outcomes[i]; o != "ok" && o != "perm" {
				if failed[k] == nil {
					failed[k] = map[string]bool{}
				}
				failed[k][m.IdempotencyKey] = true
			}
		}
	pauses:
		for k, keys := range failed {
			pauses++
			for key := range keys {
				if mayResume[key] {
					unchecked++
					continue pauses
				}
			}
			pausedBy[k] = keys
			pausedAt[k] = r
		}
	}
	ledger.mu.Unlock()
	t.Logf("strict groups: %d messages sent, %d pauses (%d not checked: a retry may have resumed them unsent), %d resumed by a retry", strictSent, pauses, unchecked, resumes)
	t.Logf("%d answers (%d by the actor form): %v", len(answers), len(actorAnswers), kinds)
	for _, k := range []string{"ok", "retry", "perm", "throttle", "whole", "panic", "paused", "retry-after"} {
		assert.Positive(t, kinds[k], "no answer of kind %s: the test did not exercise it", k)
	}
}

// checkFaultAnswer checks one answer against what the destination did with
// its message, and names the answer's kind.
func checkFaultAnswer(t *testing.T, body, id string, err error, outcomes []string) string {
	t.Helper()
	if len(outcomes) == 0 {
		// Never sent: the answer must be an error that says so, or that it
		// may have been.
		if !assert.Error(t, err, "%s: answered id %q though no destination saw it", body, id) {
			return "bad"
		}
		var retry *messages.RetryAfterError
		var paused *messages.GroupPausedError
		switch {
		case errors.As(err, &paused):
			assert.Equal(t, groupOf(body), paused.Group, "%s: paused as another group", body)
			return "paused"
		case errors.Is(err, clustered.ErrUnreachable):
			return "unreachable"
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return "ctx"
		case errors.Is(err, messages.ErrStopped):
			return "stopped"
		case errors.As(err, &retry):
			return "retry-after"
		}
		assert.Fail(t, "an unsent message's answer says something else", "%s: %v", body, err)
		return "bad"
	}
	outcome := outcomes[0]
	if err != nil && (errors.Is(err, clustered.ErrUnreachable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// The caller stopped waiting, or lost its owner, while the request
		// was on its way: ambiguous, and said so.
		return "ctx-after-send"
	}
	var entry *codec.EntryError
	switch outcome {
	case "ok":
		assert.NoError(t, err, "%s: accepted, answered with an error", body)
		assert.Equal(t, "id:"+body, id, "%s: answered with another message's id", body)
	case "retry", "perm", "throttle", "whole":
		want := map[string]string{"retry": "Retry", "perm": "Perm", "throttle": "Throttle", "whole": "Whole"}[outcome]
		if assert.ErrorAs(t, err, &entry, "%s: %s, answered %v (id %q)", body, outcome, err, id) {
			assert.Equal(t, want, entry.Code, "%s: another message's error", body)
			assert.Equal(t, outcome == "perm", codec.IsPermanent(err), "%s: permanence lost", body)
			assert.Equal(t, outcome == "throttle", codec.IsThrottled(err), "%s: throttling lost", body)
		}
	case "panic":
		assert.ErrorIs(t, err, codec.ErrCodecPanic, "%s: its request panicked, answered %v (id %q)", body, err, id)
		assert.False(t, codec.IsPermanent(err), "%s: a SendBatch panic is retryable", body)
	}
	return outcome
}
