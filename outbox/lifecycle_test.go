package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/outbox"
)

// silent is an OrderedSender that never answers.
type silent struct{ begun chan struct{} }

func (s *silent) Send(ctx context.Context, _ string, _ codec.Message) (codec.Result, error) {
	<-ctx.Done()
	return codec.Result{}, ctx.Err()
}

func (s *silent) Begin(string, codec.Message, time.Time, func(codec.Result, error)) {
	select {
	case s.begun <- struct{}{}:
	default:
	}
}

func TestRunReturnsWithinTheLeaseWhenNoAnswerComes(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	insert(t, db, table, outbox.Row{Destination: "d", Group: "g", Body: []byte("1")}, outbox.Row{Destination: "d", Group: "g", Body: []byte("2")})
	s := &silent{begun: make(chan struct{}, 1)}
	const lease = 500 * time.Millisecond
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: s, Lease: lease})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-s.begun
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * lease):
		t.Fatal("Run did not return within its lease")
	}
	assert.Equal(t, int64(2), r.Stats().Inflight, "rows without an answer stay claimed")
	unsent, _, _ := counts(t, db, table)
	assert.Equal(t, 2, unsent)
}

func TestSentRowsAreKeptForKeepSentThenDeleted(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	insert(t, db, table, outbox.Row{Destination: "d", Body: []byte("1")}, outbox.Row{Destination: "d", Body: []byte("2")})
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: &scripted{answers: []error{nil}, seen: map[string]int{}},
		KeepSent: 500 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	require.Eventually(t, func() bool {
		_, sent, _ := counts(t, db, table)
		return sent == 2
	}, 30*time.Second, 10*time.Millisecond, "sent rows kept")
	require.Eventually(t, func() bool {
		unsent, sent, dead := counts(t, db, table)
		return unsent+sent+dead == 0
	}, 30*time.Second, 50*time.Millisecond, "and deleted after KeepSent")
	require.NoError(t, stop())
}

func TestNewRefusesABadConfig(t *testing.T) {
	db := pool(t)
	sender := &scripted{answers: []error{nil}}
	for _, tc := range []struct {
		cfg  outbox.Config
		want string
	}{
		{outbox.Config{Sender: sender}, "Config.DB is nil"},
		{outbox.Config{DB: db}, "Config.Sender is nil"},
		{outbox.Config{DB: db, Sender: sender, Table: "Robert'); DROP TABLE students;--"}, "table name"},
		{outbox.Config{DB: db, Sender: sender, Lease: -time.Second}, "Config.Lease is negative"},
		{outbox.Config{DB: db, Sender: sender, Lease: time.Millisecond}, "Config.Lease 1ms is below 100ms"},
		{outbox.Config{DB: db, Sender: sender, Inflight: -1}, "Config.Inflight is negative"},
	} {
		_, err := outbox.New(tc.cfg)
		assert.ErrorContains(t, err, tc.want)
	}
	r, err := outbox.New(outbox.Config{DB: db, Sender: sender, Table: "no_such_table"})
	require.NoError(t, err)
	err = r.Run(context.Background())
	assert.ErrorContains(t, err, "no_such_table")
	assert.False(t, errors.Is(err, context.Canceled))
}

// switched is an OrderedSender that never answers until on, then accepts
// at once; it records the keys it is handed.
type switched struct {
	on   atomic.Bool
	mu   sync.Mutex
	keys []string
}

func (s *switched) Send(ctx context.Context, _ string, _ codec.Message) (codec.Result, error) {
	return codec.Result{}, errors.New("unused")
}

func (s *switched) Begin(_ string, m codec.Message, _ time.Time, done func(codec.Result, error)) {
	if !s.on.Load() {
		return
	}
	s.mu.Lock()
	s.keys = append(s.keys, m.IdempotencyKey)
	s.mu.Unlock()
	done(codec.Result{ID: "m"}, nil)
}

func TestANewRunRelaysTheRowsAnEarlierRunLeftUnanswered(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	insert(t, db, table, outbox.Row{Destination: "d", Group: "g", Body: []byte("1")}, outbox.Row{Destination: "d", Group: "g", Body: []byte("2")})
	s := &switched{}
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: s, Inflight: 1, Lease: 300 * time.Millisecond,
		PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	require.Eventually(t, func() bool { return r.Stats().Claimed == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, stop()) // row 1 stays claimed, its answer unknown

	s.on.Store(true)
	stop = run(t, r)
	waitDrained(t, db, table, 30*time.Second)
	require.NoError(t, stop())
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Equal(t, []string{"1", "2"}, s.keys, "row 1 again, first")
}

// forgetful is an OrderedSender that loses the answer of each row's first
// delivery (it never calls done) and accepts every later one.
type forgetful struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (f *forgetful) Send(context.Context, string, codec.Message) (codec.Result, error) {
	panic("forgetful: Send is not used by a relay with an OrderedSender")
}

func (f *forgetful) Begin(_ string, m codec.Message, _ time.Time, done func(codec.Result, error)) {
	f.mu.Lock()
	again := f.seen[m.IdempotencyKey]
	f.seen[m.IdempotencyKey] = true
	f.mu.Unlock()
	if again {
		done(codec.Result{ID: "m-" + m.IdempotencyKey}, nil)
	}
}

// A row whose answer never comes is given up on a Lease after its
// deadline, put back (its lease is long over) and sent again, in order.
func TestRowsWhoseAnswerNeverComesArePutBackAndSentAgain(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	var rows []outbox.Row
	for i := range 6 {
		rows = append(rows, outbox.Row{Destination: "d", Group: "g", Body: []byte{byte(i)}})
	}
	insert(t, db, table, rows...)
	const lease = 200 * time.Millisecond
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: &forgetful{seen: map[string]bool{}}, Lease: lease,
		Backoff: time.Millisecond, MaxBackoff: time.Millisecond, PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	require.Eventually(t, func() bool { return r.Stats().Sent == 6 }, 20*lease, 5*time.Millisecond,
		"rows whose answer was lost are sent again: %+v", r.Stats())
	require.NoError(t, stop())
	assert.GreaterOrEqual(t, r.Stats().Retried, int64(6), "each row was put back once")
	unsent, _, _ := counts(t, db, table)
	assert.Zero(t, unsent)
}
