package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crashRows is the size of the kill -9 proof: 100,000 rows, or 10,000
// under the race detector, which slows the relay several times over
// (.ci/run runs the full size without it).
func crashRows() int {
	if raceEnabled || testing.Short() {
		return 10_000
	}
	return 100_000
}

func TestARelayKilledThreeTimesLosesNothingAndKeepsGroupOrder(t *testing.T) {
	crashScenario(t, crashRows(), 1)
}

func TestTwoRelaysShareATableWhileOneIsKilled(t *testing.T) {
	crashScenario(t, crashRows(), 2)
}

// crashScenario relays n rows (8 tenants, 64 groups: 48 to Pub/Sub with
// ordering keys, 16 to a FIFO queue, whose server, kumo, slows down as it
// fills) with relays child processes, one of
// which is killed with SIGKILL at three random moments and started again
// at once; then it reads both destinations back.
func crashScenario(t *testing.T, n, relays int) {
	db := pool(t)
	table := newTable(t, db)
	s := startServers(t, true)
	copyRows(t, db, table, n, 64, 8, 48)
	cfg := childConfig{DSN: dsn(t), Table: table, PstestAddr: s.ps.Addr, KumoURL: s.kumo.URL, QueueURL: s.queueURL,
		Lease: 2 * time.Second}
	procs := make([]*child, relays)
	for i := range procs {
		procs[i] = startChild(t, cfg)
	}
	// Three moments, as fractions of the rows sent.
	moments := []float64{0.05 + 0.8*rand.Float64(), 0.05 + 0.8*rand.Float64(), 0.05 + 0.8*rand.Float64()}
	slices.Sort(moments)
	for k, f := range moments {
		require.Eventually(t, func() bool {
			unsent, _, _ := counts(t, db, table)
			return float64(unsent) <= float64(n)*(1-f)
		}, 3*time.Minute, 5*time.Millisecond)
		i := k % relays
		procs[i].kill(t)
		unsent, _, _ := counts(t, db, table)
		t.Logf("killed relay %d at %.0f%% sent (%d unsent)", i, 100*f, unsent)
		procs[i] = startChild(t, cfg)
	}
	waitDrained(t, db, table, 3*time.Minute)
	for _, p := range procs {
		p.stop(t)
	}

	unsent, sent, dead := counts(t, db, table)
	require.Equal(t, [3]int{0, n, 0}, [3]int{unsent, sent, dead}, "every row sent")
	var noID, attempts int
	require.NoError(t, db.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE message_id IS NULL OR message_id = ''), coalesce(max(attempts), 0) FROM %s`, table)).Scan(&noID, &attempts))
	assert.Zero(t, noID, "every sent row has its message id")

	ps := check(t, published(s.ps))
	fifo := check(t, drainFIFO(t, s.kumo.URL, s.queueURL))
	t.Logf("Pub/Sub: %d messages, %d duplicates, %d order violations; FIFO: %d messages, %d duplicates, %d order violations; most attempts of a row: %d",
		len(ps.distinct), ps.duplicates, ps.violations, len(fifo.distinct), fifo.duplicates, fifo.violations, attempts)
	for id := int64(1); id <= int64(n); id++ {
		if !ps.distinct[id] && !fifo.distinct[id] {
			t.Fatalf("row %d is at no destination", id)
		}
	}
	assert.Equal(t, n, len(ps.distinct)+len(fifo.distinct), "each row at one destination")
	assert.Zero(t, ps.violations, "Pub/Sub: a group's first appearances out of row order: %v", ps.examples)
	assert.Zero(t, fifo.violations, "FIFO: a group's first appearances out of row order: %v", fifo.examples)
	assert.Zero(t, fifo.duplicates, "the FIFO queue deduplicates by idempotency key")
}
