package clustered_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/messages"
)

// freePort is a loopback TCP port nobody listens on now, and that no other
// call gave out. It is taken below the range the kernel gives outgoing
// connections their ports from (Linux's ip_local_port_range), where a
// port a listener on port 0 gets lies: members poll and dial each other
// all the time, and one of those connections could take the port before
// the member it was meant for binds it (an automanaged member then never
// joins).
func freePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	if low := ephemeralLow(); low > minTestPort+1000 {
		for range 1000 {
			p := minTestPort + rand.IntN(low-minTestPort)
			if portsGiven[p] {
				continue
			}
			if lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
				_ = lis.Close()
				portsGiven[p] = true
				return p
			}
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// minTestPort is the lowest port freePort gives out.
const minTestPort = 20000

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow is the lowest port the kernel gives outgoing connections; 0
// if it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return 0
	}
	return low
}

// managed is a cluster of members on loopback with the automanaged
// provider: each member serves /_health on a port of its slot and polls every
// slot's; a slot whose member is not running is skipped.
type managed struct {
	health  []int    // each slot's health port
	remotes []int    // each slot's remote port
	hosts   []string // every slot's health address
}

func newManaged(t testing.TB, slots int) *managed {
	c := &managed{}
	for range slots {
		c.health = append(c.health, freePort(t))
		c.remotes = append(c.remotes, freePort(t))
	}
	for _, p := range c.health {
		c.hosts = append(c.hosts, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return c
}

// start starts the member of slot i.
func (c *managed) start(t testing.TB, i int, names []string, o memberOpts) *member {
	o.provider = automanaged.NewWithConfig(200*time.Millisecond, c.health[i], c.hosts...)
	o.port = c.remotes[i]
	o.noCleanup = true
	return startMember(t, names, o)
}

// address is the remote address of slot i's member.
func (c *managed) address(i int) string { return fmt.Sprintf("127.0.0.1:%d", c.remotes[i]) }

// owner is the slot that owns destination when the slots in running are
// the members.
func (c *managed) owner(destination string, running ...int) int {
	var ms cluster.Members
	for _, i := range running {
		ms = append(ms, &cluster.Member{Host: "127.0.0.1", Port: int32(c.remotes[i]), Kinds: []string{clustered.Kind}})
	}
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(ms)
	addr := rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Identity: destination, Kind: clustered.Kind})
	for _, i := range running {
		if c.address(i) == addr {
			return i
		}
	}
	return -1
}

// pick returns n names from pool that slot wants owns once the slots in
// after are the members, and n that it does not.
func (c *managed) pick(pool []string, slot, n int, after ...int) []string {
	var own, other []string
	for _, name := range pool {
		if c.owner(name, after...) == slot {
			if len(own) < n {
				own = append(own, name)
			}
		} else if len(other) < n {
			other = append(other, name)
		}
	}
	return append(own, other...)
}

// moves returns up to n names of pool that slot from owns while the slots
// in before are the members and slot to owns once the slots in after are.
func (c *managed) moves(pool []string, n, from int, before []int, to int, after []int) []string {
	var out []string
	for _, name := range pool {
		if len(out) < n && c.owner(name, before...) == from && c.owner(name, after...) == to {
			out = append(out, name)
		}
	}
	return out
}

// handoffTuning makes groups likely to overlap if the hand-off broke: many
// requests in flight per destination, short linger.
var handoffTuning = codec.Tuning{Linger: 2 * time.Millisecond, MaxInflight: 8}

// loadDeadline is each load delivery's deadline.
const loadDeadline = 5 * time.Second

// checkCrashed asserts what a crash promises the load's callers: every
// acknowledged message stored, acknowledged messages in their callers'
// order and stored once, ErrUnreachable the only error, and every answer
// within loadDeadline (and a second of slack). It returns the stored
// messages out of their callers' order, unacknowledged included, which a
// crash may leave.
func (l *load) checkCrashed(t *testing.T, w *watched) (unordered int) {
	t.Helper()
	missing, violations, unordered := l.checkAcknowledged(w)
	assert.Zero(t, missing, "acknowledged but missing")
	assert.Zero(t, violations, "acknowledged messages out of order or stored twice")
	for class, n := range l.errs {
		assert.Equal(t, "unreachable", class, "%d errors, first: %s", n, l.first[class])
	}
	assert.Less(t, l.maxLat, loadDeadline+time.Second, "a delivery outlived its deadline")
	return unordered
}

// load runs callers until stopped and records what they were answered.
type load struct {
	mu     sync.Mutex
	acked  map[string]string // body → message id
	errs   map[string]int    // error text class → count
	first  map[string]string // error text class → its first error, whole, and when
	done   []time.Time       // when each success was answered
	lats   []time.Duration   // and how long it took, from its first attempt
	maxLat time.Duration
	failed []attempt // the deliveries answered an error
	stop   chan struct{}
	wg     sync.WaitGroup
}

// attempt is a delivery of the load that was answered an error: when it
// began and was answered, its error's class and its error.
type attempt struct {
	Start, End time.Time
	Class, Err string
}

func newLoad() *load {
	return &load{acked: map[string]string{}, errs: map[string]int{}, first: map[string]string{}, stop: make(chan struct{})}
}

// startLoad starts, on each member of from, per destination and group,
// per callers: each sends its group's messages one after another, each
// with loadDeadline, a body "caller/seq" and that body as its idempotency
// key.
func startLoad(from []*member, dests []string, groups, per int) *load {
	return startLoadAs("m", from, dests, groups, per)
}

// startLoadAs is startLoad with callers named prefix, then the member's
// index in from: loads that run at once need prefixes of their own.
func startLoadAs(prefix string, from []*member, dests []string, groups, per int) *load {
	l := newLoad()
	for mi, m := range from {
		for _, d := range dests {
			for g := range groups {
				for c := range per {
					caller := fmt.Sprintf("%s%d.%s.g%d.c%d", prefix, mi, d, g, c)
					l.wg.Add(1)
					go l.caller(m, d, fmt.Sprintf("g%d", g), caller)
				}
			}
		}
	}
	return l
}

func (l *load) caller(m *member, dest, group, caller string) {
	defer l.wg.Done()
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return
		default:
		}
		body := fmt.Sprintf("%s/%d", caller, seq)
		ctx, cancel := context.WithTimeout(context.Background(), loadDeadline)
		start := time.Now()
		id, err := m.node.Deliver(ctx, dest, codec.Message{Group: group, Body: []byte(body), IdempotencyKey: body})
		cancel()
		lat := time.Since(start)
		l.mu.Lock()
		if err == nil {
			l.acked[body] = id
			l.done = append(l.done, time.Now())
			l.lats = append(l.lats, lat)
			l.maxLat = max(l.maxLat, lat)
		} else {
			class := classify(err)
			l.failed = append(l.failed, attempt{Start: start, End: time.Now(), Class: class, Err: err.Error()})
			l.errs[class]++
			if _, ok := l.first[class]; !ok {
				l.first[class] = fmt.Sprintf("%s, after %v, from %s", err, lat, m.system.Address())
			}
		}
		l.mu.Unlock()
		if errors.Is(err, messages.ErrStopped) {
			return
		}
	}
}

// classify names an error by what a caller branches on.
func classify(err error) string {
	switch {
	case errors.Is(err, clustered.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, messages.ErrStopped):
		return "stopped"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return err.Error()
}

// finish stops the callers and waits for them.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
}

// gap is the longest time between two successive successes.
func (l *load) gap() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	done := slices.Clone(l.done)
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	var g time.Duration
	for i := 1; i < len(done); i++ {
		g = max(g, done[i].Sub(done[i-1]))
	}
	return g
}

func (l *load) successes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// waitSuccesses waits until the load has had n more successes.
func (l *load) waitSuccesses(t testing.TB, n int) {
	t.Helper()
	want := l.successes() + n
	require.Eventually(t, func() bool { return l.successes() >= want }, 15*time.Second, 5*time.Millisecond)
}

// check compares what the server stored with what the callers were told:
// every acknowledged message is there under its id (missing counts those
// that are not), and each caller's messages, acknowledged or not, are in
// its order (violations).
func (l *load) check(w *watched) (missing, violations int) {
	missing, _, violations = l.checkAcknowledged(w)
	return missing, violations
}

// checkAcknowledged is what a crash promises: every acknowledged
// message is stored under its id, and each caller's acknowledged messages
// are stored in its order, once each (violations). A message answered
// ErrUnreachable may be stored anywhere, or not at all: unordered counts the
// stored messages, acknowledged or not, that are out of their caller's
// order.
func (l *load) checkAcknowledged(w *watched) (missing, violations, unordered int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stored := map[string]string{}
	lastAcked := map[string]int{}
	last := map[string]int{}
	for _, m := range w.srv.Messages() {
		body := string(m.Data)
		stored[body] = m.ID
		caller, seqText, _ := strings.Cut(body, "/")
		seq, _ := strconv.Atoi(seqText)
		if prev, ok := last[caller]; ok && seq <= prev {
			unordered++
		}
		last[caller] = seq
		if _, acked := l.acked[body]; !acked {
			continue
		}
		if prev, ok := lastAcked[caller]; ok && seq <= prev {
			violations++
		}
		lastAcked[caller] = seq
	}
	for body, id := range l.acked {
		if stored[body] != id {
			missing++
		}
	}
	return missing, violations, unordered
}

// slowest is the longest delivery answered before t, and the longest
// answered after it.
func (l *load) slowest(t time.Time) (before, after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, at := range l.done {
		if at.Before(t) {
			before = max(before, l.lats[i])
		} else {
			after = max(after, l.lats[i])
		}
	}
	return before, after
}
