package outbox_test

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/outbox"
)

// fillSent fills table with n rows of which every 100th is unsent (1 %),
// in one statement, and analyzes it.
func fillSent(t testing.TB, db *pgxpool.Pool, table string, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, fmt.Sprintf(`
INSERT INTO %s (id, destination, tenant, grp, body, state, sent_at, message_id)
SELECT i, 'd', 't' || (i %% 8), 'g' || (i %% 64), 'row', CASE WHEN i %% 100 = 0 THEN 0 ELSE 1 END,
	CASE WHEN i %% 100 = 0 THEN NULL ELSE now() END, CASE WHEN i %% 100 = 0 THEN NULL ELSE 'm' END
FROM generate_series(1, $1::bigint) AS i`, table), n)
	require.NoError(t, err)
	_, err = db.Exec(ctx, "VACUUM ANALYZE "+table)
	require.NoError(t, err)
}

// requireIndexScan fails unless the claim walks table's partial index of
// unsent rows in id order (the scan aliased o in the plan) with no sort
// of the rows it takes, and nothing reads table by a sequential or bitmap
// scan. (The small side table of leases, table_leases, may be read whole.)
func requireIndexScan(t testing.TB, plan, table string) {
	t.Helper()
	require.Regexp(t, claimScan(table), plan)
	require.NotContains(t, plan, "Sort Key: o.id")
	require.NotContains(t, plan, "Seq Scan on "+table+" ")
	require.NotContains(t, plan, "Bitmap Heap Scan on "+table+" ")
}

// claimScan matches the claim's walk of table's unsent rows in id order.
func claimScan(table string) *regexp.Regexp {
	return regexp.MustCompile(`Index Scan using ` + table + `_unsent on ` + table + ` o `)
}

func TestTheClaimIsAnIndexScan(t *testing.T) {
	db := pool(t)
	table := newTable(t, db)
	fillSent(t, db, table, 200_000)
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: &scripted{answers: []error{nil}}})
	require.NoError(t, err)
	plan, err := r.ExplainClaim(context.Background(), true)
	require.NoError(t, err)
	t.Logf("claim at 200,000 rows, 1%% unsent:\n%s", plan)
	requireIndexScan(t, plan, table)

	// Without the index the check fails.
	_, err = db.Exec(context.Background(), "DROP INDEX "+table+"_unsent")
	require.NoError(t, err)
	plan, err = r.ExplainClaim(context.Background(), false)
	require.NoError(t, err)
	assert.NotRegexp(t, claimScan(table), plan)
}

// BenchmarkClaimAtTenMillionRows claims ClaimBatch rows of a table of 10
// million rows, 1 % unsent (EXPLAIN ANALYZE, rolled back), and checks the
// plan. Filling the table takes minutes: it is kept between runs on a
// server given by SINKBATCH_POSTGRES_DSN.
func BenchmarkClaimAtTenMillionRows(b *testing.B) {
	db := pool(b)
	const n = 10_000_000
	table := "outbox_bench_10m"
	ctx := context.Background()
	var have int64
	if err := db.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&have); err != nil || have != n {
		_, _ = db.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s, %[1]s_leases", table))
		require.NoError(b, outbox.CreateTable(ctx, db, table))
		start := time.Now()
		fillSent(b, db, table, n)
		b.Logf("filled %d rows in %v", n, time.Since(start).Round(time.Second))
	}
	require.NoError(b, outbox.CreateTable(ctx, db, table)) // a table kept from an earlier version gets what it lacks
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: &scripted{answers: []error{nil}}})
	require.NoError(b, err)
	plan, err := r.ExplainClaim(ctx, true)
	require.NoError(b, err)
	b.Logf("claim at 10,000,000 rows, 1%% unsent:\n%s", plan)
	requireIndexScan(b, plan, table)
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.ExplainClaim(ctx, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/claim")
}
