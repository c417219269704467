package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/outbox"
)

// gated is an OrderedSender whose answers the test gives: it records the
// order in which rows begin, and answers each row when told, or at once
// once open.
type gated struct {
	mu     sync.Mutex
	begun  []int64 // row ids in the order begun, repeats included
	done   map[int64]func(codec.Result, error)
	open   bool
	opened chan struct{}
}

func newGated() *gated { return &gated{done: map[int64]func(codec.Result, error){}} }

func (g *gated) Send(ctx context.Context, d string, m codec.Message) (codec.Result, error) {
	panic("gated: Send is not used by a relay with an OrderedSender")
}

func (g *gated) Begin(_ string, m codec.Message, _ time.Time, done func(codec.Result, error)) {
	id, _ := strconv.ParseInt(m.IdempotencyKey, 10, 64)
	g.mu.Lock()
	g.begun = append(g.begun, id)
	open := g.open
	if !open {
		g.done[id] = done
	}
	g.mu.Unlock()
	if open {
		done(codec.Result{ID: "m-" + m.IdempotencyKey}, nil)
	}
}

// answer answers row id, which must be waiting.
func (g *gated) answer(t *testing.T, id int64, err error) {
	t.Helper()
	g.mu.Lock()
	done := g.done[id]
	delete(g.done, id)
	g.mu.Unlock()
	require.NotNil(t, done, "row %d is not waiting for an answer", id)
	done(codec.Result{ID: "m-" + strconv.FormatInt(id, 10)}, err)
}

// waiting reports whether row id waits for an answer.
func (g *gated) waiting(id int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[id] != nil
}

// openUp answers every waiting row with success, and every row begun from
// now on at once.
func (g *gated) openUp() {
	g.mu.Lock()
	g.open = true
	waiting := g.done
	g.done = nil
	g.mu.Unlock()
	for id, done := range waiting {
		done(codec.Result{ID: "m-" + strconv.FormatInt(id, 10)}, nil)
	}
}

// firstBegins is the order of each row's first begin.
func (g *gated) firstBegins() []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[int64]bool{}
	var out []int64
	for _, id := range g.begun {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// A relay sends its next claim while it still begins the rows of the last
// one, so a claim can be under way when a row of a group fails. That claim
// may hold later rows of the group (it did not know of the failure); they
// must be put back, and no claim may take the group's rows past them
// before they are written back. Here: rows 1-2 are in flight; a claim
// (held on the claim lock) takes rows 3-6 of the group; rows 1 and 2 fail
// meanwhile. Were the next claim to take rows 1, 2, 7 and 8 while 3-6 are
// still this relay's, 7 and 8 would go before 3-6; were claims to take
// the group's rows while it fails, they would be put back, for ever.
func TestAClaimUnderWayWhenItsGroupFailsLetsNoLaterRowOvertake(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	ctx := context.Background()
	row := func(i int) outbox.Row {
		return outbox.Row{Destination: "d", Group: "g", Body: []byte("row " + strconv.Itoa(i))}
	}
	insert(t, db, table, row(1), row(2))
	sender := newGated()
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: sender, ClaimBatch: 4, Inflight: 64,
		PollInterval: 5 * time.Millisecond, Backoff: time.Nanosecond, MaxBackoff: time.Nanosecond})
	require.NoError(t, err)
	stop := run(t, r)
	require.Eventually(t, func() bool { return sender.waiting(1) && sender.waiting(2) }, 10*time.Second, time.Millisecond)

	// Hold claims back: the relay's next claim waits on the lock, under way.
	lock, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer lock.Release()
	_, err = lock.Exec(ctx, `SELECT pg_advisory_lock($1)`, outbox.ClaimLock(table))
	require.NoError(t, err)
	insert(t, db, table, row(3), row(4), row(5), row(6), row(7), row(8))
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, time.Millisecond, "a claim waits on the claim lock")

	// Rows 1 and 2 fail while that claim is under way; the relay takes the
	// answers (its loop does not wait for the claim).
	sender.answer(t, 1, errors.New("transient"))
	sender.answer(t, 2, errors.New("transient"))
	require.Eventually(t, func() bool { return r.Stats().Inflight == 0 }, 10*time.Second, time.Millisecond)

	_, err = lock.Exec(ctx, `SELECT pg_advisory_unlock($1)`, outbox.ClaimLock(table))
	require.NoError(t, err)
	sender.openUp()
	// A claim that skipped no failing group would take rows of it that
	// come back put back, for ever: the group would never drain.
	require.Eventually(t, func() bool { return r.Stats().Sent == 8 }, 20*time.Second, time.Millisecond,
		"every row is sent: %+v", r.Stats())
	require.NoError(t, stop())
	assert.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8}, sender.firstBegins(), "first begins in row order")
	st := r.Stats()
	assert.GreaterOrEqual(t, st.Retried, int64(2), "rows 1 and 2 were put back: %+v", st)
}
