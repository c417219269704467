package outbox_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/ankusa/sinkbatch/outbox/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	code := func() int {
		defer stopServer()
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent(),
			// pgxpool's health check ends on its own after Close.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
			// protoactor's cluster starts these and never stops them (see
			// package clustered's tests).
			goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster/clusterproviders/test.(*Provider).startTtlReport.func1"),
			goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.(*Gossiper).StartGossiping.NewThrottle.func3.1"),
			goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.NewGossipActor.NewThrottleWithLogger.func2.1"),
			goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	serverOnce sync.Once
	server     *pgtest.Server
	serverDSN  string
	serverErr  error
)

func stopServer() {
	if server != nil {
		_ = server.Stop()
	}
}

// dsn is the PostgreSQL the tests use: $SINKBATCH_POSTGRES_DSN, else a
// throwaway server started once from the installed binaries; the test
// skips, saying how to enable it, when there is neither.
func dsn(t testing.TB) string {
	t.Helper()
	if v := os.Getenv(pgtest.EnvDSN); v != "" {
		return v
	}
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		server, serverErr = pgtest.Start(ctx)
		if serverErr == nil {
			serverDSN = server.DSN
		}
	})
	if serverErr == pgtest.ErrNoPostgres {
		t.Skipf("no PostgreSQL: set %s to a server's DSN, or install PostgreSQL (pg_config --bindir) so that the tests start one", pgtest.EnvDSN)
	}
	if serverErr != nil {
		t.Fatalf("starting PostgreSQL: %v", serverErr)
	}
	return serverDSN
}

// pool opens a pool on the test database, closed when the test ends.
func pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

var tableSeq struct {
	sync.Mutex
	n int
}

// newTable creates a table of its own (and its table of leases) for one test.
func newTable(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	tableSeq.Lock()
	tableSeq.n++
	name := fmt.Sprintf("outbox_%d_%d", os.Getpid(), tableSeq.n)
	tableSeq.Unlock()
	ctx := context.Background()
	if err := createTable(ctx, db, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %[1]s, %[1]s_leases", name))
	})
	return name
}
