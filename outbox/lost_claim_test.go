package outbox_test

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/outbox"
)

// A claim can commit in the database while the relay sees it fail (its
// context ends, or the connection breaks, after the server ran it): the
// rows it took stay leased to the relay, which does not know them. The
// relay's later claims must not pass them: the group waits until their
// lease ends and they are claimed again.
func TestAClaimThatCommitsWhileTheRelaySeesItFailKeepsGroupOrder(t *testing.T) {
	setup := pool(t)
	table := newTable(t, setup)
	const n = 30
	copyRows(t, setup, table, n, 1, 1, 1) // one group

	px := startLosingProxy(t, setup.Config().ConnConfig)
	cfg := setup.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", px.port()
	cfg.ConnConfig.Fallbacks = nil
	// One statement a round trip: the claim's text is in the bytes the
	// proxy reads, every time.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)

	s := &recordingSender{}
	s.onFirst = px.loseNextClaim // after the first claim: the next one is lost
	r, err := outbox.New(outbox.Config{DB: db, Table: table, Sender: s, Lease: time.Second,
		Inflight: 4, ClaimBatch: 4, PollInterval: 10 * time.Millisecond, FlushInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, r)
	waitDrained(t, setup, table, 30*time.Second)
	require.NoError(t, stop())

	require.Equal(t, int64(1), px.lost.Load(), "one claim's answer was lost after the server committed it")
	v := check(t, s.stored())
	assert.Len(t, v.distinct, n)
	assert.Zero(t, v.violations, "the group's first appearances out of row order: %v", v.examples)
}

// recordingSender records the messages it is sent, in order, and accepts
// them all.
type recordingSender struct {
	mu      sync.Mutex
	msgs    []stored
	onFirst func()
}

func (s *recordingSender) Send(_ context.Context, _ string, m codec.Message) (codec.Result, error) {
	s.mu.Lock()
	s.msgs = append(s.msgs, stored{key: m.IdempotencyKey, group: m.Group})
	first := len(s.msgs) == 1
	s.mu.Unlock()
	if first && s.onFirst != nil {
		s.onFirst()
	}
	return codec.Result{ID: "m" + m.IdempotencyKey}, nil
}

func (s *recordingSender) stored() []stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stored(nil), s.msgs...)
}

// losingProxy forwards TCP connections on 127.0.0.1 to PostgreSQL. Armed,
// it forwards the next claim (a statement with FOR UPDATE … SKIP LOCKED)
// to the server but never returns the server's answer: the claim commits,
// and the client's context ends waiting for it.
type losingProxy struct {
	ln    net.Listener
	armed atomic.Bool
	lost  atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startLosingProxy(t *testing.T, target *pgx.ConnConfig) *losingProxy {
	t.Helper()
	if len(target.Host) > 0 && target.Host[0] == '/' {
		t.Skip("the proxy needs PostgreSQL on TCP")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &losingProxy{ln: ln}
	addr := net.JoinHostPort(target.Host, strconv.Itoa(int(target.Port)))
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			var swallow atomic.Bool
			p.wg.Add(2)
			go func() { // client to server
				defer p.wg.Done()
				defer s.Close()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					k, err := c.Read(buf)
					if k > 0 {
						if bytes.Contains(buf[:k], []byte("SKIP LOCKED")) && p.armed.CompareAndSwap(true, false) {
							swallow.Store(true)
							p.lost.Add(1)
						}
						if _, werr := s.Write(buf[:k]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // server to client
				defer p.wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					k, err := s.Read(buf)
					if k > 0 && !swallow.Load() {
						if _, werr := c.Write(buf[:k]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *losingProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *losingProxy) loseNextClaim() { p.armed.Store(true) }
