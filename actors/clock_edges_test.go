package actors_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/fakecodec"
	"github.com/ankusa/sinkbatch/messages"
)

// A *messages.Deliver's Deadline at the edges of the batcher's monotonic
// clock (actors/batcher: clock, instant, timeAt): none (DefaultTimeout
// from arrival), one without a monotonic reading (a wall-clock time, as
// time.Date or Round(0) make), one nanosecond away, the Unix epoch and the
// first instant after the zero time (long past, but not the zero value
// that means "none"), the year 9999 and the last instant time.Time holds
// (never). Each is answered once, by its future's bound at the latest: a
// past deadline at once with an error wrapping context.DeadlineExceeded,
// never sent; a near one at that deadline, not before; a far one with the
// destination's answer.
func TestDeliverDeadlinesAtTheClocksEdges(t *testing.T) {
	const (
		timeout = 150 * time.Millisecond
		within  = 10 * time.Second // the futures' bound: only catches hangs
	)
	system, inst := start(t, actors.Config{Name: "clock", DefaultTimeout: timeout})
	lim := codec.Limits{MaxEntries: 10, MaxBytes: 1 << 20}
	silent, _ := silentCodec(t, lim)
	echo := fakecodec.New("echo", lim)
	echo.Hook = echoIDs
	last := time.Unix(math.MaxInt64-62135596801, 999999999) // the last instant time.Time holds

	for _, tc := range []struct {
		name     string
		deadline func() time.Time
		dest     *fakecodec.Codec
		expired  bool          // answered DeadlineExceeded
		notEarly time.Duration // and no earlier than this after the send
	}{
		{"none, silent", func() time.Time { return time.Time{} }, silent, true, timeout},
		{"none, answered", func() time.Time { return time.Time{} }, echo, false, 0},
		{"wall clock only, silent", func() time.Time { return time.Now().Round(0).Add(100 * time.Millisecond) }, silent, true, 99 * time.Millisecond},
		{"wall clock only, answered", func() time.Time { return time.Now().Round(0).Add(time.Minute) }, echo, false, 0},
		{"one nanosecond", func() time.Time { return time.Now().Add(time.Nanosecond) }, echo, true, 0},
		{"Unix epoch", func() time.Time { return time.Unix(0, 0) }, echo, true, 0},
		{"just after the zero time", func() time.Time { return time.Time{}.Add(time.Nanosecond) }, echo, true, 0},
		{"year 9999", func() time.Time { return time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC) }, echo, false, 0},
		{"the last instant", func() time.Time { return last }, echo, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := fmt.Sprintf("%s-%d", tc.name, i)
					sentAt := time.Now()
					d := &messages.Deliver{Codec: tc.dest, Message: codec.Message{Tenant: "t", Body: []byte(body)}, Deadline: tc.deadline()}
					res, err := system.Root.RequestFuture(inst.PID(), d, within).Result()
					took := time.Since(sentAt)
					if !assert.NoError(t, err, "%s: no answer within %v", body, within) {
						return
					}
					dl := res.(*messages.Delivered)
					if tc.expired {
						assert.ErrorIs(t, dl.Err, context.DeadlineExceeded, body)
						assert.GreaterOrEqual(t, took, tc.notEarly, "%s answered before its deadline", body)
						return
					}
					if assert.NoError(t, dl.Err, body) {
						assert.Equal(t, "id-"+body, dl.ID)
					}
				}()
			}
			wg.Wait()
		})
	}
	for _, m := range echo.Sent() {
		for _, past := range []string{"one nanosecond", "Unix epoch", "just after the zero time"} {
			assert.NotContains(t, string(m.Body), past, "a delivery whose deadline had passed was sent")
		}
	}
}

// Tunings at the edges of the batcher's clock: Linger and IdleTimeout of a
// nanosecond (every message flushes at once, and the batcher stops idle
// between bursts, while deliveries keep coming), and of math.MaxInt64 with
// MaxEntries 1 (every batch is full at once: nothing waits for a linger
// or idle timer that never fires). Every delivery gets its own id, the
// destination's batchers come and go, and end.
func TestTuningAtTheClocksEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		tune codec.Tuning
		max  int
	}{
		{"a nanosecond", codec.Tuning{Linger: 1, IdleTimeout: 1, RetryAfterMax: 1}, 10},
		{"forever, full at once", codec.Tuning{Linger: math.MaxInt64, IdleTimeout: math.MaxInt64, RetryAfterMax: math.MaxInt64, GroupPauseMax: math.MaxInt64}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, inst := start(t, actors.Config{Name: "tune"})
			c := fakecodec.New("tune", codec.Limits{MaxEntries: tc.max, MaxBytes: 1 << 20})
			c.Tune = tc.tune
			c.Hook = echoIDs
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 40 {
						body := fmt.Sprintf("g%d-%d", g, i)
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						id, err := inst.Deliver(ctx, c, codec.Message{Tenant: fmt.Sprint("t", g%3), Group: fmt.Sprint("grp", g%2), Body: []byte(body)})
						cancel()
						if assert.NoError(t, err, body) {
							assert.Equal(t, "id-"+body, id)
						}
					}
				}()
			}
			wg.Wait()
			if tc.tune.IdleTimeout == 1 {
				require.Eventually(t, func() bool { return inst.Stats().Batchers == 0 }, 10*time.Second, time.Millisecond,
					"a batcher with IdleTimeout 1ns stops once idle")
			}
		})
	}
}
