// Package pgtest starts a throwaway PostgreSQL server from the binaries
// installed on the machine, for tests and demos: a private data directory,
// a private port on 127.0.0.1, a socket directory of its own, fsync off.
// As root, the server runs as the postgres user (PostgreSQL refuses root).
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EnvDSN is the environment variable naming a running server's DSN; the
// project's tests use it instead of starting one when it is set.
const EnvDSN = "SINKBATCH_POSTGRES_DSN"

// Server is a running throwaway server.
type Server struct {
	DSN string // postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable

	dir, bin string
	asUser   string // "" when the server runs as the caller
	stopOnce sync.Once
}

// ErrNoPostgres is returned by Start when no PostgreSQL binaries are found.
var ErrNoPostgres = errors.New("pgtest: no PostgreSQL binaries (pg_config --bindir, /usr/lib/postgresql/*/bin)")

// BinDir finds the installed PostgreSQL binaries: pg_config --bindir, else
// the newest /usr/lib/postgresql/*/bin holding initdb.
func BinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func version(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// Start initialises a data directory under a new temporary directory and
// starts a server on a free 127.0.0.1 port. Stop it with Stop, which also
// removes the directory. ctx bounds the start.
func Start(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sinkbatch-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.asUser = "postgres"
	}
	if err := s.run(ctx, "initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", port, dir)
	if err := s.run(ctx, "pg_ctl", "-D", s.data(), "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w; server log:\n%s", err, log)
	}
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// run runs one of the server's binaries, as the postgres user when the
// caller is root.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	path := filepath.Join(s.bin, name)
	var cmd *exec.Cmd
	if s.asUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", s.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtest: %s: %w: %s", name, err, out.Bytes())
	}
	return nil
}

// Stop stops the server at once and removes its directory. It is safe to
// call more than once.
func (s *Server) Stop() error {
	var err error
	s.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = s.run(ctx, "pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
		if rerr := os.RemoveAll(s.dir); err == nil {
			err = rerr
		}
	})
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
