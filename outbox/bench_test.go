package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/outbox"
)

// BenchmarkRelayThroughput relays rows from PostgreSQL to pstest (64
// ordering keys) and compares, in the same run and at the same
// concurrency (4096 rows or callers in flight):
//   - relay/deliver: the relay's rows/s ÷ sinkbatch's own Deliver
//     throughput to that destination (the mean of a pass before the
//     relay's and one after);
//   - relay/naive: ÷ a naive relay that claims one row per statement,
//     publishes it alone in one request, and deletes it.
func BenchmarkRelayThroughput(b *testing.B) {
	const (
		rows        = 50_000
		naiveRows   = 5_000
		concurrency = outbox.DefaultInflight
	)
	db := pool(b)
	s := startServers(b, false)
	ctx := context.Background()
	cs, closeCodecs, err := codecs(ctx, s.ps.Addr, "", "")
	require.NoError(b, err)
	inst := instance(b)
	b.Cleanup(closeCodecs)
	sender := outbox.Local(inst, cs)
	ps := cs[destPubSub]
	// The naive relay makes a round trip per row: it gets more connections.
	cfg, err := pgxpool.ParseConfig(dsn(b))
	require.NoError(b, err)
	cfg.MaxConns = 64
	naiveDB, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(naiveDB.Close)

	// sinkbatch alone: concurrency callers deliver rows messages, each
	// the message the relay makes of the row of the same id; the rate in
	// messages/s.
	deliver := func() float64 {
		s.ps.ClearMessages()
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range concurrency {
			wg.Go(func() {
				for i := next.Add(1); i <= rows; i = next.Add(1) {
					m := rowMessage(i)
					if _, err := inst.Deliver(ctx, ps, m); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return rows / time.Since(start).Seconds()
	}

	// A first pass warms the actor system, the codec's connection and
	// pstest up: it runs at a fraction of the speed of the next.
	deliver()

	var relayRate, deliverRate, naiveRate float64
	for b.Loop() {
		// The baseline runs before and after the relay, and counts their
		// mean, so that a machine whose load drifts during a pass does
		// not favour either side.
		before := deliver()

		// The relay.
		s.ps.ClearMessages()
		table := newTable(b, db)
		copyRows(b, db, table, rows, 64, 8, 64)
		r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: sender, Inflight: concurrency})
		require.NoError(b, err)
		start := time.Now()
		stop := run(b, r)
		// Relayed: every row's result written (Stats counts it then).
		require.Eventually(b, func() bool { return r.Stats().Sent == rows }, 5*time.Minute, time.Millisecond)
		elapsed := time.Since(start)
		require.NoError(b, stop())
		relayRate += rows / elapsed.Seconds()
		after := deliver()
		deliverRate += (before + after) / 2
		b.Logf("relay: %d rows in %v (%.0f/s), %d state statements (%.4f per row); Deliver: %.0f/s before, %.0f/s after",
			rows, elapsed.Round(time.Millisecond), rows/elapsed.Seconds(), r.Stats().Statements, float64(r.Stats().Statements)/rows, before, after)

		// The naive relay, on fewer rows: it is slow.
		s.ps.ClearMessages()
		table = newTable(b, db)
		copyRows(b, db, table, naiveRows, 64, 8, 64)
		start = time.Now()
		naive(b, naiveDB, table, ps, concurrency)
		naiveRate += naiveRows / time.Since(start).Seconds()
		unsent, _, _ := counts(b, db, table)
		require.Zero(b, unsent)
	}
	n := float64(b.N)
	b.ReportMetric(relayRate/n, "relay-rows/s")
	b.ReportMetric(deliverRate/n, "deliver-msgs/s")
	b.ReportMetric(naiveRate/n, "naive-rows/s")
	b.ReportMetric(relayRate/deliverRate, "relay/deliver")
	b.ReportMetric(relayRate/naiveRate, "relay/naive")
}

// rowMessage is the message the relay makes of row id of copyRows(…, 64,
// 8, 64): its tenant, group, key, body and attributes.
func rowMessage(id int64) codec.Message {
	g := id * 7919 % 64
	group := "g" + strconv.FormatInt(g, 10)
	return codec.Message{Tenant: "t" + strconv.FormatInt(g%8, 10), Group: group, IdempotencyKey: strconv.FormatInt(id, 10),
		Body: []byte("row " + strconv.FormatInt(id, 10)), Attributes: map[string]string{groupAttribute: group}}
}

// naive is the relay users write by hand: workers each claim one row
// (SKIP LOCKED), publish it in a request of its own, and delete it.
func naive(b *testing.B, db *pgxpool.Pool, table string, c codec.Codec, workers int) {
	ctx := context.Background()
	claim := fmt.Sprintf(`UPDATE %[1]s o SET available_at = now() + interval '30 seconds', attempts = o.attempts + 1
FROM (SELECT id FROM %[1]s WHERE state = 0 AND available_at <= now() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) c
WHERE o.id = c.id RETURNING o.id, o.tenant, o.grp, o.body`, table)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				var m codec.Message
				var id int64
				err := db.QueryRow(ctx, claim).Scan(&id, &m.Tenant, &m.Group, &m.Body)
				if err != nil {
					return // no row left (pgx.ErrNoRows)
				}
				m.IdempotencyKey = strconv.FormatInt(id, 10)
				res, err := c.SendBatch(ctx, []codec.Message{m})
				if err != nil || res[0].Err != nil {
					b.Errorf("publish: %v %v", err, res)
					return
				}
				if _, err := db.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE id = $1`, table), id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
