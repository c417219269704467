//go:build unix

package clustered_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/ankusa/sinkbatch/codec"
)

// maxOverlap is the most time two members may publish one destination
// after a pause or a healed partition: the lease's TTL and a request's
// round trip, with room for a loaded machine.
const maxOverlap = time.Second

// TestAPausedOwnerStopsAdmitting stops the owner of a destination's
// process for 3 s (SIGSTOP), past the 2 s after which its peers drop it,
// and lets it go on (SIGCONT), with every member delivering to the
// destination all along. Its lease lapses during the pause, so it sends
// nothing it took before, and the peers' answers tell it at once that the
// cluster dropped it: two members publish the destination for at most
// maxOverlap, measured at the server, and never after.
func TestAPausedOwnerStopsAdmitting(t *testing.T) {
	f := startFenced(t, false)
	owner := f.owner
	f.run(t, time.Second)
	require.NoError(t, f.children[owner].cmd.Process.Signal(syscall.SIGSTOP))
	f.run(t, 3*time.Second)
	require.NoError(t, f.children[owner].cmd.Process.Signal(syscall.SIGCONT))
	f.children[owner].await(t, "excluded", 10*time.Second)
	f.run(t, 2*time.Second)
	f.check(t)
}

// TestAHealedPartitionLeavesOneOwner cuts the owner of a destination off
// from its peers (a TCP proxy in front of its remote and health ports
// stops forwarding) for 3 s, then heals it. The owner's lease lapses
// while it cannot hear its peers, and once it can again they tell it the
// cluster dropped it: two members publish the destination for at most
// maxOverlap, and never after.
func TestAHealedPartitionLeavesOneOwner(t *testing.T) {
	f := startFenced(t, true)
	f.run(t, time.Second)
	f.proxies[f.owner].block()
	f.run(t, 3*time.Second)
	f.proxies[f.owner].heal()
	f.children[f.owner].await(t, "excluded", 10*time.Second)
	f.run(t, 2*time.Second)
	f.check(t)
}

// fenceTopic is the destination the fencing tests deliver to.
const fenceTopic = "fenced"

// fenced is a fencing test's cluster: three members, each a process of its
// own, publishing to one pstest through a listener per member, so that
// the server knows who published.
type fenced struct {
	children []*child
	proxies  []*proxyPair // each member's, when proxied
	owner    int
	log      *publishLog
}

// startFenced starts three members. proxied: each member's peers reach
// its remote and health ports through proxies of its own (f.proxies[i]),
// and it advertises its remote proxy's address.
func startFenced(t *testing.T, proxied bool) *fenced {
	c := newManaged(t, 3)
	f := &fenced{log: newPublishLog(t, 3)}
	peerHosts := slices.Clone(c.hosts)
	advertised := make([]string, 3)
	ranked := &managed{remotes: slices.Clone(c.remotes)}
	if proxied {
		for i := range 3 {
			remoteProxy := startProxy(t, c.address(i))
			healthProxy := startProxy(t, c.hosts[i])
			f.proxies = append(f.proxies, &proxyPair{remoteProxy, healthProxy})
			peerHosts[i] = healthProxy.addr
			advertised[i] = remoteProxy.addr
			_, port, _ := net.SplitHostPort(remoteProxy.addr)
			ranked.remotes[i], _ = strconv.Atoi(port)
		}
	}
	// The owner by the addresses the members advertise.
	f.owner = ranked.owner(fenceTopic, 0, 1, 2)
	for i := range 3 {
		hosts := slices.Clone(peerHosts)
		hosts[i] = c.hosts[i] // it reaches itself directly
		f.children = append(f.children, startFenceChild(t, i, c.health[i], c.remotes[i], advertised[i], hosts, f.log.addrs[i]))
	}
	for _, ch := range f.children {
		ch.await(t, "ready", time.Minute)
	}
	return f
}

// proxyPair are a member's remote and health proxies.
type proxyPair struct{ remote, health *proxy }

func (p *proxyPair) block() { p.remote.block(); p.health.block() }
func (p *proxyPair) heal()  { p.remote.heal(); p.health.heal() }

// run lets the members deliver for d: the test's stimulus, not a wait for
// an outcome.
func (f *fenced) run(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// check stops the members and asserts the overlap at the server: from the
// first Publish of a member other than the first owner to the first
// owner's last Publish.
func (f *fenced) check(t *testing.T) {
	t.Helper()
	for _, ch := range f.children {
		ch.say(t, "quit")
	}
	for _, ch := range f.children {
		ch.await(t, "quit", time.Minute)
		ch.waitEnd(t)
	}
	byOwner, others := f.log.split(f.owner)
	require.NotEmpty(t, byOwner, "the owner published")
	require.NotEmpty(t, others, "another member took the destination over")
	firstOther := others[0]
	lastOwner := byOwner[len(byOwner)-1]
	overlap := max(lastOwner.Sub(firstOther), 0)
	t.Logf("owner's Publishes %d, the others' %d; overlap at the server %v (bound %v)", len(byOwner), len(others), overlap, maxOverlap)
	assert.LessOrEqual(t, overlap, maxOverlap, "two members published the destination for longer than the bound")
}

// publishLog is a pstest Pub/Sub server with one listener per member,
// recording when each Publish to fenceTopic arrived and through which.
type publishLog struct {
	addrs []string
	mu    sync.Mutex
	at    map[int][]time.Time // by listener
}

func newPublishLog(t *testing.T, n int) *publishLog {
	srv := pstest.NewServer()
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: testProject + "/topics/" + fenceTopic})
	require.NoError(t, err)
	l := &publishLog{at: map[int][]time.Time{}}
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := req.(*pubsubpb.PublishRequest); ok {
			if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
				l.record(p.LocalAddr.String())
			}
		}
		return handler(ctx, req)
	}))
	pubsubpb.RegisterPublisherServer(g, &srv.GServer)
	var wg sync.WaitGroup
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		l.addrs = append(l.addrs, lis.Addr().String())
		wg.Add(1)
		go func() { defer wg.Done(); _ = g.Serve(lis) }()
	}
	t.Cleanup(func() {
		g.Stop()
		wg.Wait()
		_ = srv.Close()
	})
	return l
}

func (l *publishLog) record(local string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, a := range l.addrs {
		if a == local {
			l.at[i] = append(l.at[i], now)
		}
	}
}

// split returns the Publishes through owner's listener and the others',
// each in time order.
func (l *publishLog) split(owner int) (byOwner, others []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, ts := range l.at {
		if i == owner {
			byOwner = append(byOwner, ts...)
		} else {
			others = append(others, ts...)
		}
	}
	slices.SortFunc(byOwner, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(others, func(a, b time.Time) int { return a.Compare(b) })
	return byOwner, others
}

// proxy forwards TCP connections to a target until block, and again
// after heal: a partition on loopback. Blocked, it accepts and reads
// nothing, and forwards nothing of the connections it has.
type proxy struct {
	addr    string
	target  string
	mu      sync.Mutex
	blocked chan struct{} // closed while not blocked; replaced by block
}

func startProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	require.NoError(t, err)
	open := make(chan struct{})
	close(open)
	p := &proxy{addr: lis.Addr().String(), target: target, blocked: open}
	var conns sync.WaitGroup
	var all []net.Conn
	var allMu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			allMu.Lock()
			all = append(all, in, out)
			allMu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); p.pipe(out, in) }()
			go func() { defer conns.Done(); p.pipe(in, out) }()
		}
	}()
	t.Cleanup(func() {
		p.heal()
		_ = lis.Close()
		<-done
		allMu.Lock()
		for _, c := range all {
			_ = c.Close()
		}
		allMu.Unlock()
		conns.Wait()
	})
	return p
}

// pipe copies from src to dst, holding what it read while blocked.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.open()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) open() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked
}

func (p *proxy) block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = make(chan struct{})
}

func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.blocked:
	default:
		close(p.blocked)
	}
}

const fenceRole = "SINKBATCH_FENCE_CHILD"

// startFenceChild starts a member of a fencing test, in a process of its
// own.
func startFenceChild(t *testing.T, slot, health, port int, advertised string, hosts []string, pubsubAddr string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFenceChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fenceRole+"=1",
		fmt.Sprintf("SINKBATCH_FENCE_SLOT=%d", slot),
		fmt.Sprintf("SINKBATCH_FENCE_HEALTH=%d", health),
		fmt.Sprintf("SINKBATCH_FENCE_PORT=%d", port),
		"SINKBATCH_FENCE_ADVERTISED="+advertised,
		"SINKBATCH_FENCE_HOSTS="+strings.Join(hosts, ","),
		"SINKBATCH_FENCE_PUBSUB="+pubsubAddr)
	return spawn(t, cmd, "FENCE ")
}

// TestFenceChild is a member of a fencing test, in a process of its own;
// run otherwise, it does nothing. It delivers to fenceTopic from 8
// callers, each its own ordering key, until told to quit, and says
// "excluded" when its node learns the cluster dropped it.
func TestFenceChild(t *testing.T) {
	if os.Getenv(fenceRole) == "" {
		t.Skip("a child process of the fencing tests")
	}
	atoi := func(k string) int { return envInt(t, os.Getenv(k)) }
	hosts := strings.Split(os.Getenv("SINKBATCH_FENCE_HOSTS"), ",")
	o := memberOpts{
		provider:  automanaged.NewWithConfig(200*time.Millisecond, atoi("SINKBATCH_FENCE_HEALTH"), hosts...),
		port:      atoi("SINKBATCH_FENCE_PORT"),
		retries:   1,
		noCleanup: true,
		codec: func(name string) codec.Codec {
			return lazyPubSub(t, os.Getenv("SINKBATCH_FENCE_PUBSUB"), name, codec.Tuning{})
		},
	}
	if a := os.Getenv("SINKBATCH_FENCE_ADVERTISED"); a != "" {
		o.remote = []remote.ConfigOption{remote.WithAdvertisedHost(a)}
	}
	m := startMember(t, []string{fenceTopic}, o)
	require.Eventually(t, func() bool { return m.node.MembersSeen() == 3 }, time.Minute, 10*time.Millisecond)
	slot := os.Getenv("SINKBATCH_FENCE_SLOT")
	deliver := func(key string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := m.node.Deliver(ctx, fenceTopic, codec.Message{Group: key, Body: []byte("fenced")})
		return err
	}
	require.Eventually(t, func() bool { return deliver("warm-"+slot) == nil }, time.Minute, 10*time.Millisecond)
	fmt.Println("FENCE ready")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if deliver(fmt.Sprintf("key-%s-%d", slot, i)) != nil {
					failed.Add(1)
				}
			}
		}()
	}
	go func() {
		<-m.node.Excluded()
		fmt.Println("FENCE excluded")
	}()
	s := bufio.NewScanner(os.Stdin)
	for s.Scan() {
		if s.Text() == "quit" {
			close(stop)
			wg.Wait()
			fmt.Println("FENCE quit")
			os.Exit(0)
		}
	}
}
