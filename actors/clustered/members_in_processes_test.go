//go:build unix

// Each member of these tests is a process of its own, so that they build
// and run under -race: several members in one process make protoactor
// report data races inside itself. A child's data race fails the test.

package clustered_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
)

// TestJoinHandsOffBetweenProcesses: a member joins while two members
// deliver, concurrently for each ordering group, to destinations some of
// which move to it. No group ever has two requests in flight at the
// server, every caller's order holds, every delivery succeeds, and
// nothing acknowledged is missing.
func TestJoinHandsOffBetweenProcesses(t *testing.T) {
	p, loaders := startLoaded(t, 0, 1)
	joined := time.Now()
	p.start(t, 2)
	p.waitMembers(t, 3, p.members...)
	p.successes(t, loaders, 100)
	p.checkHandOff(t, "join", joined, p.finish(t, loaders))
	p.quit(t)
}

// TestLeaveHandsOffBetweenProcesses: a member leaves gracefully while the
// two others deliver, concurrently for each ordering group, to
// destinations some of which it owned. No group ever has two requests in
// flight, order holds, every delivery succeeds, nothing acknowledged is
// missing.
func TestLeaveHandsOffBetweenProcesses(t *testing.T) {
	p, loaders := startLoaded(t, 0, 1, 2)
	leaver := p.members[2]
	left := time.Now()
	leaver.say(t, "leave")
	leaver.await(t, "left", time.Minute)
	p.waitMembers(t, 2, loaders...)
	p.successes(t, loaders, 100)
	p.checkHandOff(t, "leave", left, p.finish(t, loaders))
	p.quit(t)
}

// checkHandOff asserts what a hand-off that began at began promises a
// load's callers: no group ever had two requests in flight at the server,
// every caller's order held, every delivery succeeded, nothing
// acknowledged is missing.
func (p *processes) checkHandOff(t *testing.T, what string, began time.Time, l *load) {
	t.Helper()
	missing, violations := l.check(p.w)
	t.Logf("%s: %d delivered, %d requests", what, len(l.acked), p.w.requests.Load())
	for i, a := range l.failed {
		if i == 5 {
			t.Logf("and %d more failed", len(l.failed)-i)
			break
		}
		t.Logf("failed: began %v after the %s began, took %v: %s", a.Start.Sub(began), what, a.End.Sub(a.Start), a.Err)
	}
	assert.Zero(t, p.w.overlaps.Load(), "requests of one group in flight at once")
	assert.Zero(t, violations, "order violations")
	assert.Zero(t, missing, "acknowledged but missing")
	assert.Empty(t, l.errs, "first of each: %v", l.first)
}

// maxUnreachableAnswer bounds how long after a member's death a caller
// waits for its delivery the member held to be answered ErrUnreachable:
// the other members learn of the death when its connections break, not at
// the deliveries' deadlines (loadDeadline).
const maxUnreachableAnswer = 2 * time.Second

// TestAKilledOwnerLosesNothingAcknowledged kills (SIGKILL) a member that
// owns destinations while the two others deliver to them. Nothing
// acknowledged is missing at the server nor out of its caller's order,
// the deliveries the dead member held are answered ErrUnreachable within
// maxUnreachableAnswer of its death, every error is ErrUnreachable, and
// deliveries succeed again once the others drop it.
func TestAKilledOwnerLosesNothingAcknowledged(t *testing.T) {
	p, loaders := startLoaded(t, 0, 1, 2)
	victim := p.members[2]
	killed := time.Now()
	victim.kill(t)
	p.waitMembers(t, 2, loaders...)
	p.successes(t, loaders, 100)
	l := p.finish(t, loaders)

	l.checkCrashed(t, p.w)
	var held int
	var slowest, slowestLater attempt
	for _, a := range l.failed {
		switch {
		case a.Class != "unreachable":
		case a.Start.Before(killed):
			held++
			if a.End.After(slowest.End) {
				slowest = a
			}
		case a.End.Sub(a.Start) > slowestLater.End.Sub(slowestLater.Start):
			slowestLater = a
		}
	}
	t.Logf("kill -9: %d delivered, errors %v; of those in flight at the kill, %d answered ErrUnreachable, the last %v after it; slowest begun later: %v (%q)",
		len(l.acked), l.errs, held, slowest.End.Sub(killed), slowestLater.End.Sub(slowestLater.Start), slowestLater.Err)
	assert.Positive(t, held, "no delivery in flight at the kill was answered ErrUnreachable")
	assert.LessOrEqual(t, slowest.End.Sub(killed), maxUnreachableAnswer, "a delivery the dead member held was answered late: %q", slowest.Err)
	p.quit(t)
}

// TestMalformedWireInputLeavesTheProcessServing sends a member in a
// process of its own, over protoactor's gRPC service, envelopes that
// panic protoactor's receive path or do not decode. The member ends only
// each bad stream: its process stays up, and it keeps serving its own
// callers and its peer's, whose deliveries to the destinations it owns
// cross the wire.
func TestMalformedWireInputLeavesTheProcessServing(t *testing.T) {
	p := startProcesses(t, 2, 0, 1)
	target, peer := p.members[0], p.members[1]
	dest := p.c.pick(p.pool, 0, 1, 0, 1)[0]
	deliver := func() {
		t.Helper()
		for _, ch := range []*child{target, peer} {
			ch.say(t, "deliver "+dest)
			assert.Equal(t, "ok", ch.await(t, "delivered", time.Minute))
		}
	}
	deliver()
	conn, err := grpc.NewClient(p.c.address(0), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := remote.NewRemotingClient(conn)
	for name, batch := range malformedBatches(p.c.address(0)) {
		t.Run(name, func(t *testing.T) { sendOnAStream(t, client, batch) })
	}
	deliver()
	p.quit(t)
}

// startLoaded starts the members of slots running of a cluster of three
// and, on slots 0 and 1, a load to destinations slot 2 owns some of once
// all three are members; it returns once each load had 100 successes.
func startLoaded(t *testing.T, running ...int) (p *processes, loaders []*child) {
	t.Helper()
	p = startProcesses(t, 3, running...)
	dests := p.c.pick(p.pool, 2, 3, 0, 1, 2)
	loaders = p.members[:2]
	p.load(t, loaders, dests)
	p.successes(t, loaders, 100)
	return p, loaders
}

// processes is a test's cluster of members in processes of their own
// (automanaged on loopback), publishing to one watched Pub/Sub server in
// the test's process.
type processes struct {
	c       *managed
	w       *watched
	pool    []string
	members []*child // by slot; nil until started
	dir     string   // where members write their loads' answers
}

// processLatency is the server's latency per Publish: long enough that a
// broken hand-off makes two requests of a group overlap.
const processLatency = 100 * time.Millisecond

// startProcesses makes a cluster of slots members and starts those of
// running, waiting until each lists all of them.
func startProcesses(t *testing.T, slots int, running ...int) *processes {
	t.Helper()
	pool := names(24)
	p := &processes{c: newManaged(t, slots), w: newWatched(t, processLatency, pool...), pool: pool,
		members: make([]*child, slots), dir: t.TempDir()}
	var started []*child
	for _, slot := range running {
		started = append(started, p.spawn(t, slot))
	}
	for _, ch := range started {
		ch.await(t, "ready", time.Minute)
	}
	p.waitMembers(t, len(running), started...)
	return p
}

// memberRole is the environment variable that makes the test binary a
// member in a process of its own (TestMemberProcess).
const memberRole = "SINKBATCH_MEMBER_PROCESS"

// start starts slot's member and waits until it is ready.
func (p *processes) start(t *testing.T, slot int) {
	t.Helper()
	p.spawn(t, slot).await(t, "ready", time.Minute)
}

// spawn starts slot's member.
func (p *processes) spawn(t *testing.T, slot int) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemberProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), p.c.env()...), memberRole+"=1",
		fmt.Sprintf("SINKBATCH_MEMBER_SLOT=%d", slot), "SINKBATCH_MEMBER_PUBSUB="+p.w.addr)
	p.members[slot] = spawn(t, cmd, "MEMBER ")
	return p.members[slot]
}

// waitMembers waits until each of chs lists n members.
func (p *processes) waitMembers(t *testing.T, n int, chs ...*child) {
	t.Helper()
	for _, ch := range chs {
		ch.say(t, fmt.Sprintf("members %d", n))
	}
	for _, ch := range chs {
		ch.await(t, "members", time.Minute)
	}
}

// load starts a load on each of chs, to dests (TestMemberProcess's
// load).
func (p *processes) load(t *testing.T, chs []*child, dests []string) {
	t.Helper()
	for _, ch := range chs {
		ch.say(t, "load "+strings.Join(dests, ","))
		ch.await(t, "loading", time.Minute)
	}
}

// successes waits until the load of each of chs has had n more successes.
func (p *processes) successes(t *testing.T, chs []*child, n int) {
	t.Helper()
	for _, ch := range chs {
		ch.say(t, fmt.Sprintf("successes %d", n))
	}
	for _, ch := range chs {
		ch.await(t, "successes", time.Minute)
	}
}

// finish stops the loads of chs and returns what their callers were
// answered, all in one.
func (p *processes) finish(t *testing.T, chs []*child) *load {
	t.Helper()
	all := newLoad()
	for i, ch := range chs {
		path := filepath.Join(p.dir, fmt.Sprintf("load-%d.json", i))
		ch.say(t, "finish "+path)
		ch.await(t, "finished", time.Minute)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		var r loadReport
		require.NoError(t, json.Unmarshal(b, &r))
		all.add(r)
	}
	return all
}

// quit makes every running member quit, each of which must end by itself
// (with no data race reported).
func (p *processes) quit(t *testing.T) {
	t.Helper()
	var running []*child
	for _, ch := range p.members {
		if ch != nil && !ch.hasEnded() {
			running = append(running, ch)
			ch.say(t, "quit")
		}
	}
	for _, ch := range running {
		ch.await(t, "quit", time.Minute)
		ch.waitEnd(t)
	}
}

// loadReport is what a load's callers were answered, as a member's
// process hands it to the test's.
type loadReport struct {
	Acked  map[string]string
	Errs   map[string]int
	First  map[string]string
	MaxLat time.Duration
	Failed []attempt
}

func (l *load) report() loadReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	return loadReport{Acked: l.acked, Errs: l.errs, First: l.first, MaxLat: l.maxLat, Failed: l.failed}
}

// add adds r's answers to l's.
func (l *load) add(r loadReport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for body, id := range r.Acked {
		l.acked[body] = id
	}
	for class, n := range r.Errs {
		l.errs[class] += n
	}
	for class, first := range r.First {
		if _, ok := l.first[class]; !ok {
			l.first[class] = first
		}
	}
	l.maxLat = max(l.maxLat, r.MaxLat)
	l.failed = append(l.failed, r.Failed...)
}

// TestMemberProcess is a member of a test whose members are processes of
// their own; run otherwise, it does nothing. It says "ready" once it
// started, then follows its parent's lines:
//   - members n: says "members" once it lists n members;
//   - load d1,d2,…: starts callers (startLoadAs's, 2 groups of 4 callers
//     per destination) and says "loading";
//   - successes n: says "successes" once its load had n more successes;
//   - finish path: stops the load, writes what its callers were answered
//     to path (a loadReport) and says "finished";
//   - deliver d: delivers one message to d and says "delivered ok", or
//     "delivered" and the error;
//   - leave: leaves the cluster gracefully and says "left";
//   - quit: says "quit" and ends the process, with exit code 66 if the
//     race detector reported a data race.
//
// Its remote has the settings the package doc advises: ReceiveLimit
// (which guards the receive path) and MaxRetryCount 1.
func TestMemberProcess(t *testing.T) {
	if os.Getenv(memberRole) == "" {
		t.Skip("a member in a process of its own, of the tests in members_in_processes_test.go")
	}
	c := managedFromEnv(t)
	slot := envInt(t, os.Getenv("SINKBATCH_MEMBER_SLOT"))
	addr := os.Getenv("SINKBATCH_MEMBER_PUBSUB")
	m := c.start(t, slot, names(24), memberOpts{
		// The node's warnings, which the parent prints if the test fails.
		logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		retries: 1,
		remote:  []remote.ConfigOption{clustered.ReceiveLimit(8 << 20)},
		codec:   func(name string) codec.Codec { return lazyPubSub(t, addr, name, handoffTuning) },
	})
	fmt.Println("MEMBER ready")
	var l *load
	s := bufio.NewScanner(os.Stdin)
	for s.Scan() {
		cmd, arg, _ := strings.Cut(s.Text(), " ")
		switch cmd {
		case "members":
			n := envInt(t, arg)
			require.Eventually(t, func() bool { return m.node.MembersSeen() == n },
				time.Minute, 10*time.Millisecond, "the member does not list %d members", n)
			fmt.Println("MEMBER members")
		case "load":
			l = startLoadAs(fmt.Sprintf("s%d.", slot), []*member{m}, strings.Split(arg, ","), 2, 4)
			fmt.Println("MEMBER loading")
		case "successes":
			l.waitSuccesses(t, envInt(t, arg))
			fmt.Println("MEMBER successes")
		case "finish":
			l.finish()
			b, err := json.Marshal(l.report())
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(arg, b, 0o600))
			fmt.Println("MEMBER finished")
		case "deliver":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := m.node.Deliver(ctx, arg, codec.Message{Body: []byte("served")})
			cancel()
			if err != nil {
				fmt.Println("MEMBER delivered", err)
			} else {
				fmt.Println("MEMBER delivered ok")
			}
		case "leave":
			m.leave(t)
			fmt.Println("MEMBER left")
		case "quit":
			fmt.Println("MEMBER quit")
			os.Exit(0)
		default:
			t.Fatalf("unknown command %q", s.Text())
		}
	}
}
