package actors_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
)

// adv6Trap is a slog.Handler that, on the first "group resumed" record a
// retry logs, tells entered, waits for proceed and panics: the batcher's
// actor is held inside its handling of the retry's Deliver, after the
// retry was queued, and then crashes there.
type adv6Trap struct {
	entered, proceed chan struct{}
	once             *sync.Once
}

func (h adv6Trap) Enabled(context.Context, slog.Level) bool { return true }
func (h adv6Trap) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h adv6Trap) WithGroup(string) slog.Handler            { return h }
func (h adv6Trap) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sinkbatch: group resumed" {
		return nil
	}
	retry := false
	r.Attrs(func(a slog.Attr) bool {
		retry = retry || (a.Key == "by" && a.Value.String() == "retry")
		return true
	})
	if !retry {
		return nil
	}
	trapped := false
	h.once.Do(func() { trapped = true })
	if !trapped {
		return nil
	}
	close(h.entered)
	<-h.proceed
	panic("adv6: the logger panicked")
}

// A delivery is no longer the batcher's current one once it is queued: a
// request goroutine may then send it, answer it and let go of its record,
// which serves another call at once. Here the actor crashes (its logger
// panics) while still handling a retry that resumed its group, after a
// request goroutine has sent and answered that retry, its caller has
// returned, and new callers of another destination have taken records.
// The restart answers what the crashed incarnation held with
// ErrBatcherDown; had it still held the retry as its current delivery, it
// would answer that through a record that now belongs to another call,
// which would get ErrBatcherDown from a destination that never restarted.
func TestAdv6ACrashAfterQueuingAnswersNoRecordItLetGo(t *testing.T) {
	const within = 10 * time.Second
	trap := adv6Trap{entered: make(chan struct{}), proceed: make(chan struct{}), once: &sync.Once{}}
	_, inst := start(t, actors.Config{Name: "adv6current", Logger: slog.New(trap)})

	// One destination, one request at a time, next to no linger: "p" waits for
	// the valve, "a0" fails retryably (its group pauses), anything else
	// is answered its body as its id.
	valve := make(chan struct{})
	entered := make(chan struct{}, 1)
	// A failed test must not leave the actor or a request held: Stop
	// would wait for them.
	openValve, proceed := adv6Closer(t, valve), adv6Closer(t, trap.proceed)
	c := fakecodec.New("adv6current", codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20})
	c.Tune = codec.Tuning{Linger: time.Nanosecond, MaxInflight: 1, StrictGroups: true}
	c.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			switch string(m.Body) {
			case "p":
				entered <- struct{}{}
				select {
				case <-valve:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			case "a0":
				res[i].Err = fmt.Errorf("adv6: retryable failure of %s", m.Body)
				continue
			}
			res[i].ID = string(m.Body)
		}
		return res, nil
	}
	deliver := func(tenant, group, key, body string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return inst.Deliver(ctx, c, codec.Message{Tenant: tenant, Group: group, IdempotencyKey: key, Body: []byte(body)})
	}
	type answer struct {
		id  string
		err error
	}
	async := func(f func() (string, error)) chan answer {
		ch := make(chan answer, 1)
		go func() { id, err := f(); ch <- answer{id, err} }()
		return ch
	}

	_, err := deliver("a", "g", "k1", "a0")
	require.Error(t, err, "a0 fails and pauses g")
	plug := async(func() (string, error) { return deliver("p", "", "", "p") })
	<-entered // p holds the one request slot
	retry := async(func() (string, error) { return deliver("a", "g", "k1", "a1") })
	<-trap.entered // the actor has queued a1 and logs that g resumed

	// p's request ends; its goroutine takes a1 for the slot, sends it and
	// answers it: a1's record is let go of by both parties.
	openValve()
	require.Equal(t, answer{id: "p"}, <-plug)
	require.Equal(t, answer{id: "a1"}, <-retry)

	// New calls take records from the pool, one likely a1's, and wait
	// for another destination's valve.
	const others = 64
	valve2 := make(chan struct{})
	openValve2 := adv6Closer(t, valve2)
	var sent2 atomic.Int64
	c2 := fakecodec.New("adv6current2", codec.Limits{MaxEntries: others, MaxBytes: 1 << 20})
	c2.Tune = codec.Tuning{Linger: time.Millisecond, MaxInflight: 1}
	c2.Hook = func(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
		sent2.Add(int64(len(batch)))
		select {
		case <-valve2:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		res := make([]codec.Result, len(batch))
		for i, m := range batch {
			res[i].ID = string(m.Body)
		}
		return res, nil
	}
	var wg sync.WaitGroup
	for i := range others {
		body := fmt.Sprint("b", i)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			id, err := inst.Deliver(ctx, c2, codec.Message{Tenant: "b", Body: []byte(body)})
			if assert.NoError(t, err, "%s: its destination never restarted", body) {
				assert.Equal(t, body, id)
			}
		})
	}
	require.Eventually(t, func() bool { return sent2.Load()+int64(inst.Stats().Queued) == others }, within, time.Millisecond,
		"every new call holds its record, queued or in the held request")

	// The actor crashes in its handling of a1 and restarts; a delivery
	// after it is answered by the next incarnation, once the crashed one
	// has answered what it held.
	proceed()
	id, err := deliver("a", "", "k2", "after")
	require.NoError(t, err)
	require.Equal(t, "after", id)
	openValve2()
	wg.Wait()
}

// adv6Closer returns a function that closes ch once, and closes it when
// the test ends if it has not been.
func adv6Closer(t *testing.T, ch chan struct{}) func() {
	var once sync.Once
	f := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(f)
	return f
}
