package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/outbox"
)

func TestARelaySendsEveryRowInGroupOrderAndDeletesIt(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, true)
	const n = 20000
	copyRows(t, db, table, n, 16, 4, 12)
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: localSender(t, s)})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, db, table, time.Minute)
	require.NoError(t, stop())

	unsent, sent, dead := counts(t, db, table)
	assert.Equal(t, [3]int{0, 0, 0}, [3]int{unsent, sent, dead}, "sent rows are deleted by default")
	v := check(t, append(published(s.ps), drainFIFO(t, s.kumo.URL, s.queueURL)...))
	assert.Len(t, v.distinct, n)
	assert.Zero(t, v.violations)
	assert.Zero(t, v.duplicates)
	st := r.Stats()
	assert.Equal(t, int64(n), st.Sent)
	assert.GreaterOrEqual(t, st.Claimed, int64(n))
	t.Logf("stats: %+v", st)
	assert.Zero(t, st.Inflight)
	t.Logf("statements per row: %.4f (%d statements, %d rows)", float64(st.Statements)/n, st.Statements, n)
	if !raceEnabled { // the race detector slows the relay, and a slow relay writes smaller batches
		assert.LessOrEqual(t, float64(st.Statements)/n, 0.02)
	}
}

func TestEnqueueAddsRowsWithTheTransactionOnly(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	ctx := context.Background()

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Enqueue(ctx, tx, table, outbox.Row{Destination: "d", Group: "g", Body: []byte("x")}))
	require.NoError(t, tx.Rollback(ctx))
	unsent, _, _ := counts(t, db, table)
	assert.Zero(t, unsent, "a rolled back transaction leaves no row")

	insert(t, db, table,
		outbox.Row{Destination: "d", Tenant: "a", Group: "g", Body: []byte("1"), Attributes: map[string]string{"k": "v"}},
		outbox.Row{Destination: "d", Group: "g", IdempotencyKey: "mine", Body: []byte("2")})
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT id, tenant, grp, idempotency_key, body, attributes->>'k' FROM %s ORDER BY id`, table))
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var id int64
		var tenant, grp, key string
		var body []byte
		var attr *string
		require.NoError(t, rows.Scan(&id, &tenant, &grp, &key, &body, &attr))
		a := "<nil>"
		if attr != nil {
			a = *attr
		}
		got = append(got, fmt.Sprintf("%s/%s/%q/%s/%s", tenant, grp, key, body, a))
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{`a/g/""/1/v`, `/g/"mine"/2/<nil>`}, got)

	tx, err = db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	err = outbox.Enqueue(ctx, tx, table, outbox.Row{Body: []byte("x")})
	assert.ErrorContains(t, err, "row 0 has no Destination")
	assert.ErrorContains(t, outbox.Enqueue(ctx, tx, "bad name;", outbox.Row{Destination: "d"}), "table name")
}

func TestEnqueueToOneGroupWaitsForTheTransactionBefore(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	ctx := context.Background()
	first, err := db.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx)
	require.NoError(t, outbox.Enqueue(ctx, first, table, outbox.Row{Destination: "d", Group: "g", Body: []byte("first")}))

	done := make(chan error, 1)
	go func() {
		tx, err := db.Begin(ctx)
		if err != nil {
			done <- err
			return
		}
		defer tx.Rollback(ctx)
		if err := outbox.Enqueue(ctx, tx, table, outbox.Row{Destination: "d", Group: "g", Body: []byte("second")}); err != nil {
			done <- err
			return
		}
		done <- tx.Commit(ctx)
	}()
	// The second transaction waits on the group's advisory lock.
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting))
		return waiting == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-done)
	var order []string
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT convert_from(body, 'UTF8') FROM %s ORDER BY id`, table))
	require.NoError(t, err)
	for rows.Next() {
		var b string
		require.NoError(t, rows.Scan(&b))
		order = append(order, b)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"first", "second"}, order, "ids follow the group's commit order")
}
