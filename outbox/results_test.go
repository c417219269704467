package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/outbox"
)

// scripted is a Sender for the rules that map an answer to a row's next
// state: it answers each row's nth delivery with answers[n] (nil:
// accepted), the last answer from then on.
type scripted struct {
	answers []error
	mu      sync.Mutex
	seen    map[string]int // deliveries per idempotency key
}

func (s *scripted) Send(_ context.Context, _ string, m codec.Message) (codec.Result, error) {
	s.mu.Lock()
	n := s.seen[m.IdempotencyKey]
	s.seen[m.IdempotencyKey]++
	s.mu.Unlock()
	if err := s.answers[min(n, len(s.answers)-1)]; err != nil {
		return codec.Result{}, err
	}
	return codec.Result{ID: "m-" + m.IdempotencyKey}, nil
}

func TestEachAnswerPutsTheRowWhereItBelongs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answers  []error
		state    int // 1 sent, 2 dead
		attempts int
		lastErr  string
	}{
		{"accepted", []error{nil}, 1, 1, ""},
		{"retryable, then accepted", []error{errors.New("flaky"), nil}, 1, 2, "flaky"},
		{"paused, then accepted: no attempt counted", []error{&messages.GroupPausedError{Group: "g", Key: "k"}, nil}, 1, 1, "paused"},
		{"queue full, then accepted: no attempt counted", []error{&messages.RetryAfterError{After: time.Millisecond}, nil}, 1, 1, "queue full"},
		{"permanent: dead with its error", []error{codec.Permanent(errors.New("refused for good"))}, 2, 1, "refused for good"},
		{"retryable until MaxAttempts: dead", []error{errors.New("always")}, 2, 3, "always"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pool(t)
			table := newTable(t, db)
			var rows []outbox.Row
			for i := range 20 {
				rows = append(rows, outbox.Row{Destination: "d", Group: "g" + strconv.Itoa(i%2), Body: []byte("x")})
			}
			insert(t, db, table, rows...)
			r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: &scripted{answers: tc.answers, seen: map[string]int{}},
				KeepSent: time.Hour, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PausedDelay: time.Millisecond,
				MaxAttempts: 3, PollInterval: 5 * time.Millisecond})
			require.NoError(t, err)
			stop := run(t, r)
			waitDrained(t, db, table, 30*time.Second)
			require.NoError(t, stop())
			q, err := db.Query(context.Background(), fmt.Sprintf(
				`SELECT state, attempts, coalesce(last_error, ''), coalesce(message_id, ''), idempotency_key, id FROM %s ORDER BY id`, table))
			require.NoError(t, err)
			n := 0
			for q.Next() {
				var state, attempts int
				var lastErr, msgID, key string
				var id int64
				require.NoError(t, q.Scan(&state, &attempts, &lastErr, &msgID, &key, &id))
				assert.Equal(t, tc.state, state, "row %d", id)
				assert.Equal(t, tc.attempts, attempts, "row %d", id)
				assert.Contains(t, lastErr, tc.lastErr, "row %d", id)
				if state == 1 {
					assert.Equal(t, "m-"+strconv.FormatInt(id, 10), msgID, "the message id, for the row's own key (its id)")
				}
				n++
			}
			require.NoError(t, q.Err())
			assert.Equal(t, 20, n)
			st := r.Stats()
			if tc.state == 1 {
				assert.Equal(t, int64(20), st.Sent)
			} else {
				assert.Equal(t, int64(20), st.Dead)
			}
		})
	}
}

// failEvery fails every nth Publish with a retryable Unavailable.
type failEvery struct {
	n     int64
	calls atomic.Int64
}

func (f *failEvery) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); ok && f.calls.Add(1)%f.n == 0 {
		return true, nil, status.Error(codes.Unavailable, "injected")
	}
	return false, nil, nil
}

// poison refuses any Publish holding a message whose body is "poison".
type poison struct{}

func (poison) React(req any) (bool, any, error) {
	if p, ok := req.(*pubsubpb.PublishRequest); ok {
		for _, m := range p.Messages {
			if string(m.Data) == "poison" {
				return true, nil, status.Error(codes.InvalidArgument, "poison refused")
			}
		}
	}
	return false, nil, nil
}

func TestFailedRequestsAreRetriedInGroupOrder(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, false, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &failEvery{n: 4}})
	const n = 4000
	copyRows(t, db, table, n, 4, 2, 4) // four hot groups
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: localSender(t, s), KeepSent: time.Hour,
		Backoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, time.Minute)
	require.NoError(t, stop())
	_, sent, dead := counts(t, db, table)
	assert.Equal(t, [2]int{n, 0}, [2]int{sent, dead})
	v := check(t, published(s.ps))
	assert.Len(t, v.distinct, n)
	assert.Zero(t, v.violations, "%v", v.examples)
	st := r.Stats()
	t.Logf("stats: %+v; duplicates %d", st, v.duplicates)
	assert.Positive(t, st.Retried, "failures put rows back")
}

func TestARefusedRowIsDeadWithItsErrorAndItsGroupGoesOn(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, false, pstest.ServerReactorOption{FuncName: "Publish", Reactor: poison{}})
	var rows []outbox.Row
	for i := range 30 {
		body := "ok " + strconv.Itoa(i)
		if i == 10 {
			body = "poison"
		}
		rows = append(rows, outbox.Row{Destination: destPubSub, Group: "g", Body: []byte(body)})
	}
	insert(t, db, table, rows...)
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: localSender(t, s)})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, 30*time.Second)
	require.NoError(t, stop())
	var body, lastErr string
	require.NoError(t, db.QueryRow(context.Background(), fmt.Sprintf(`SELECT convert_from(body, 'UTF8'), last_error FROM %s WHERE state = 2`, table)).
		Scan(&body, &lastErr))
	assert.Equal(t, "poison", body)
	assert.Contains(t, lastErr, "poison refused")
	unsent, sent, dead := counts(t, db, table)
	assert.Equal(t, [3]int{0, 0, 1}, [3]int{unsent, sent, dead}, "sent rows deleted, the dead one kept")
	v := check(t, published(s.ps))
	assert.Len(t, v.distinct, 29)
	assert.Zero(t, v.violations)
	assert.Equal(t, int64(1), r.Stats().Dead)
}

func TestTheMetricsCountRowsAndTheOldestUnsentRowsAge(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	reader := metric.NewManualReader()
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	insert(t, db, table, outbox.Row{Destination: "d", Body: []byte("x")}, outbox.Row{Destination: "d", Body: []byte("y")})
	_, err := db.Exec(context.Background(), fmt.Sprintf(`UPDATE %s SET created_at = now() - interval '1 hour'`, table))
	require.NoError(t, err)
	sender := &scripted{answers: []error{nil}, seen: map[string]int{}}
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: sender, MeterProvider: mp})
	require.NoError(t, err)

	values := func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		out := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						out[m.Name] += float64(p.Value)
					}
				case metricdata.Gauge[int64]:
					for _, p := range d.DataPoints {
						out[m.Name] = float64(p.Value)
					}
				case metricdata.Gauge[float64]:
					for _, p := range d.DataPoints {
						out[m.Name] = p.Value
					}
				}
			}
		}
		return out
	}
	before := values()
	assert.InDelta(t, 3600, before["ankusa.sink_batch.outbox.oldest_unsent.age"], 60)

	stop := run(t, r)
	waitDrained(t, db, table, 30*time.Second)
	require.NoError(t, stop())
	after := values()
	assert.Equal(t, 2.0, after["ankusa.sink_batch.outbox.claimed"])
	assert.Equal(t, 2.0, after["ankusa.sink_batch.outbox.sent"])
	assert.Equal(t, 0.0, after["ankusa.sink_batch.outbox.oldest_unsent.age"])
	assert.Equal(t, 0.0, after["ankusa.sink_batch.outbox.inflight"])
}

// slow makes every Publish take a while, as a loaded server does.
type slow struct{ d time.Duration }

func (s slow) React(any) (bool, any, error) {
	<-time.After(s.d) // the server's own slowness, not a wait for an outcome
	return false, nil, nil
}

func TestRowsDroppedAtTheirDeadlineLetNoLaterRowOvertake(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, false, pstest.ServerReactorOption{FuncName: "Publish", Reactor: slow{10 * time.Millisecond}})
	const n = 2000
	copyRows(t, db, table, n, 4, 2, 4)
	// Ten messages a request, one request of a group at a time: a group's
	// rows wait in the queue longer than the short lease allows.
	ps, err := pubsub.New(context.Background(), pubsub.Config{Topic: topicName, Endpoint: s.ps.Addr, Insecure: true,
		Tuning: codec.Tuning{StrictGroups: true, MaxEntries: 10}})
	require.NoError(t, err)
	inst := instance(t)
	t.Cleanup(func() { _ = ps.Close() })
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: outbox.Local(inst, map[string]codec.Codec{destPubSub: ps}),
		Lease: 300 * time.Millisecond, KeepSent: time.Hour, Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, 2*time.Minute)
	require.NoError(t, stop())
	v := check(t, published(s.ps))
	st := r.Stats()
	t.Logf("stats: %+v; duplicates %d", st, v.duplicates)
	assert.Len(t, v.distinct, n)
	assert.Zero(t, v.violations, "%v", v.examples)
	assert.Positive(t, st.Retried, "rows were dropped at their deadline and put back")
}

func TestARowForAnUnknownDestinationIsDead(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, false)
	insert(t, db, table, outbox.Row{Destination: "nowhere", Group: "g", Body: []byte("x")},
		outbox.Row{Destination: destPubSub, Group: "g", Body: []byte("y")})
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: localSender(t, s)})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, 30*time.Second)
	require.NoError(t, stop())
	var lastErr string
	require.NoError(t, db.QueryRow(context.Background(), fmt.Sprintf(`SELECT last_error FROM %s WHERE state = 2`, table)).Scan(&lastErr))
	assert.Equal(t, `sinkbatch/outbox: unknown destination "nowhere"`, lastErr)
	assert.Len(t, published(s.ps), 1)
}
