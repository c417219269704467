package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/outbox"
)

// A relay in a child process: the test binary run again with childEnv
// set to a childConfig. It relays until its stdin closes (the parent ends
// it, or dies) and exits 0, or is killed.
const childEnv = "SINKBATCH_OUTBOX_CHILD"

type childConfig struct {
	DSN, Table                    string
	PstestAddr, KumoURL, QueueURL string
	Lease                         time.Duration
}

func childMain() int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the parent closes stdin to stop the relay, or dies
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	db, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer db.Close()
	cs, closeCodecs, err := codecs(ctx, cfg.PstestAddr, cfg.KumoURL, cfg.QueueURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer closeCodecs()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	r, err := outbox.New(outbox.Config{DB: db, Table: cfg.Table, Sender: outbox.Local(inst, cs), Lease: cfg.Lease,
		KeepSent: time.Hour, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	err = r.Run(ctx)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer stopCancel()
	_ = inst.Stop(stopCtx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "child: stats %+v\n", r.Stats())
	return 0
}

// child is a relay process the test started.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *syncBuffer
	done  chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startChild(t testing.TB, cfg childConfig) *child {
	t.Helper()
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	c := &child{out: &syncBuffer{}, done: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.stdin, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("relay process %d said:\n%s", c.cmd.Process.Pid, c.out.String())
		}
	})
	return c
}

// kill sends SIGKILL and waits for the process to end.
func (c *child) kill(t testing.TB) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	err := <-c.done
	c.done <- err // for the cleanup
	t.Logf("relay process %d killed (%v)", c.cmd.Process.Pid, err)
}

// stop closes stdin and waits for a clean exit.
func (c *child) stop(t testing.TB) {
	t.Helper()
	require.NoError(t, c.stdin.Close())
	select {
	case err := <-c.done:
		c.done <- err
		require.NoError(t, err, "relay process output:\n%s", c.out.String())
		t.Logf("relay process %d: %s", c.cmd.Process.Pid, bytes.TrimSpace([]byte(c.out.String())))
	case <-time.After(time.Minute):
		t.Fatalf("relay process did not stop; output:\n%s", c.out.String())
	}
}
