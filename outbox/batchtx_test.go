package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The relay's claims and result writes are pgx batches that take a
// transaction-level advisory lock first: the lock holds for the rest of
// the batch only if pgx sends a batch as one implicit transaction.
func TestABatchIsOneTransaction(t *testing.T) {
	db := pool(t)
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(42)`)
	b.Queue(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`)
	b.Queue(`SELECT txid_current()`)
	b.Queue(`SELECT txid_current()`)
	res := db.SendBatch(context.Background(), b)
	_, err := res.Exec()
	require.NoError(t, err)
	var held, tx1, tx2 int64
	require.NoError(t, res.QueryRow().Scan(&held))
	require.NoError(t, res.QueryRow().Scan(&tx1))
	require.NoError(t, res.QueryRow().Scan(&tx2))
	require.NoError(t, res.Close())
	assert.Equal(t, int64(1), held, "the lock outlives its statement")
	assert.Equal(t, tx1, tx2, "one transaction")
}
