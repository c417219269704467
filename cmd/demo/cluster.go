package main

// Cluster mode (-cluster N): N cluster members in this process, on loopback,
// with mutual TLS between them and the automanaged provider, deliver from
// every member to two Pub/Sub topics (one with ordering keys) through
// package clustered; halfway through, the member that owns the ordered topic
// is killed (its remote and health endpoint stop at once, with no hand-off).
// Callers retry ErrUnreachable and every other retryable error with the
// same idempotency key, as a dispatch attempt would. At the end the demo
// reads the topics back and prints lost, order violations and duplicates.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

const (
	clusterProject    = "projects/sinkbatch-demo"
	clusterOrdered    = "orders" // ordering keys: one per caller group
	clusterUnordered  = "audit"
	clusterServerName = "sinkbatch-cluster" // the name every member certificate carries
	clusterGroups     = 16                  // ordering keys, each sent by one caller per member
	clusterLatency    = 10 * time.Millisecond
)

// runCluster is the demo's cluster mode; it returns the exit code.
func runCluster(ctx context.Context, o options, logger *slog.Logger, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	if o.cluster < 2 || o.cluster > 9 {
		fmt.Fprintf(stderr, "demo: -cluster %d is outside [2, 9]\n", o.cluster)
		return 2
	}
	srv, err := newClusterServer()
	if err != nil {
		return fail(err)
	}
	defer srv.close()
	ca, err := newClusterCA()
	if err != nil {
		return fail(err)
	}

	// Every slot's health and remote port are chosen up front: the
	// automanaged provider polls a fixed list of hosts.
	health, remotes := make([]int, o.cluster), make([]int, o.cluster)
	var hosts []string
	for i := range health {
		if health[i], err = freeLoopbackPort(); err == nil {
			remotes[i], err = freeLoopbackPort()
		}
		if err != nil {
			return fail(err)
		}
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", health[i]))
	}
	members := make([]*clusterMember, o.cluster)
	for i := range members {
		m, err := startClusterMember(i, logger, srv, ca, health[i], remotes[i], hosts)
		if err != nil {
			return fail(err)
		}
		members[i] = m
	}
	defer func() {
		for _, m := range members {
			m.close()
		}
	}()
	if err := waitClusterSize(ctx, members, o.cluster); err != nil {
		return fail(err)
	}
	victim := clusterOwner(members, clusterOrdered)

	fmt.Fprintf(stdout, "sinkbatch demo, cluster mode: %d members in one process, mutual TLS, %v of load\n", o.cluster, o.duration)
	fmt.Fprintf(stdout, "  Pub/Sub: pstest at %s (%v per Publish); topics %s (%d ordering keys) and %s\n",
		srv.addr, clusterLatency, clusterOrdered, clusterGroups, clusterUnordered)
	fmt.Fprintf(stdout, "  member %d (%s) owns %s and is killed at %v\n", victim, members[victim].addr, clusterOrdered, o.duration/2)

	cl := &clusterLoad{stop: make(chan struct{}), sent: map[string]*sentMessage{}}
	start := time.Now()
	for i, m := range members {
		cl.start(i, m)
	}
	killAt := time.NewTimer(o.duration / 2)
	var killed time.Duration
	select {
	case <-killAt.C:
		killed = time.Since(start)
		cl.kill(victim)
		members[victim].crash()
	case <-ctx.Done():
	}
	select {
	case <-time.After(o.duration - time.Since(start)):
	case <-ctx.Done():
	}
	close(cl.stop)
	cl.wg.Wait()
	elapsed := time.Since(start)

	leaveCtx, cancelLeave := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelLeave()
	var wg sync.WaitGroup
	leaveErrs := make([]error, len(members))
	for i, m := range members {
		if i == victim {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaveErrs[i] = m.leave(leaveCtx)
		}()
	}
	wg.Wait()

	return cl.report(stdout, srv, elapsed, killed, errors.Join(leaveErrs...))
}

// clusterMember is one member of the demo's cluster.
type clusterMember struct {
	addr    string
	system  *actor.ActorSystem
	inst    *actors.Instance
	node    *clustered.Node
	cluster *cluster.Cluster
	codecs  []*pubsub.Codec
	dead    bool
	left    bool
}

func startClusterMember(i int, logger *slog.Logger, srv *clusterServer, ca *clusterCA, healthPort, remotePort int, hosts []string) (*clusterMember, error) {
	m := &clusterMember{addr: fmt.Sprintf("127.0.0.1:%d", remotePort)}
	log := logger.With(slog.Int("member", i))
	m.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
	var err error
	m.inst, err = actors.Start(m.system, actors.Config{Name: "demo", Logger: log})
	if err != nil {
		return nil, err
	}
	dests := clustered.Destinations{}
	for _, topic := range []string{clusterOrdered, clusterUnordered} {
		c, err := pubsub.New(context.Background(), pubsub.Config{
			Topic: clusterProject + "/topics/" + topic, Endpoint: srv.addr, Insecure: true,
			Tuning: codec.Tuning{Linger: 5 * time.Millisecond},
		})
		if err != nil {
			return nil, err
		}
		m.codecs = append(m.codecs, c)
		dests[topic] = c
	}
	m.node, err = clustered.New(m.system, clustered.Config{Instance: m.inst, Destinations: dests, Logger: log})
	if err != nil {
		return nil, err
	}
	cert, err := ca.member(int64(i + 2))
	if err != nil {
		return nil, err
	}
	// A small initial writer queue: protoactor's default preallocates 16 MB
	// per peer, which every garbage collection scans.
	rc := remote.Configure("127.0.0.1", remotePort, append(clustered.TLSOptions(clustered.MutualTLS(ca.pool, cert, clusterServerName)),
		remote.WithEndpointWriterQueueSize(1024))...)
	// The remote settings a member should have: TLSOptions (mutual TLS,
	// the peer's certificate name checked, and clustered.GuardReceive so
	// that no peer's message can end the process), and MaxRetryCount 1:
	// protoactor retries a failed connection MaxRetryCount times, 2 s
	// apart, while every message to that member waits (Attach warns about
	// more), and its shutdown waits for that too.
	rc.MaxRetryCount = 1
	provider := automanaged.NewWithConfig(250*time.Millisecond, healthPort, hosts...)
	m.cluster = cluster.New(m.system, cluster.Configure("sinkbatch-demo", provider, disthash.New(), rc, cluster.WithKinds(m.node.Kind())))
	m.cluster.StartMember()
	if err := m.node.Attach(m.cluster); err != nil {
		return nil, err
	}
	return m, nil
}

// crash stops m's remote and health endpoint at once, as a killed process
// would lose them: no hand-off, no goodbye.
func (m *clusterMember) crash() {
	m.dead = true
	_ = m.cluster.Config.ClusterProvider.Shutdown(false)
	m.cluster.Remote.Shutdown(false)
}

func (m *clusterMember) leave(ctx context.Context) error {
	m.left = true
	err := m.node.Leave(ctx)
	return errors.Join(err, m.inst.Stop(ctx))
}

// close releases what is left of m: a killed member's instance and
// connections, and its codecs' clients.
func (m *clusterMember) close() {
	if m.dead && !m.left {
		m.left = true
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		_ = m.inst.Stop(ctx)
		cancel()
		m.cluster.Remote.Shutdown(true)
		m.system.Shutdown()
	}
	for _, c := range m.codecs {
		_ = c.Close()
	}
}

// waitClusterSize waits until every member sees n members.
func waitClusterSize(ctx context.Context, members []*clusterMember, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for _, m := range members {
			all = all && m.cluster.MemberList.Members().Len() == n
		}
		if all {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("the members did not see each other: %w", ctx.Err())
		}
	}
}

// clusterOwner is the index of the member that owns destination.
func clusterOwner(members []*clusterMember, destination string) int {
	var ms cluster.Members
	for _, m := range members {
		host, port, _ := net.SplitHostPort(m.addr)
		var p int
		fmt.Sscan(port, &p)
		ms = append(ms, &cluster.Member{Host: host, Port: int32(p), Kinds: []string{clustered.Kind}})
	}
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(ms)
	owner := rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Identity: destination, Kind: clustered.Kind})
	for i, m := range members {
		if m.addr == owner {
			return i
		}
	}
	return 0
}

// sentMessage is what the demo knows of one message it sent.
type sentMessage struct {
	group     string
	submitted time.Time // first attempt
	acked     time.Time // zero: never acknowledged
	id        string
}

// clusterLoad drives the callers and records every message.
type clusterLoad struct {
	stop   chan struct{}
	killed atomic.Int64 // 1 + index of the killed member; its callers stop
	wg     sync.WaitGroup

	mu       sync.Mutex
	sent     map[string]*sentMessage // by idempotency key
	errs     map[string]int          // answers that were retried (or given up), by class
	attempts int
}

// start starts member i's callers: one per ordering key on the ordered
// topic, and four on the unordered one. Each sends one message at a time.
func (l *clusterLoad) start(i int, m *clusterMember) {
	for g := range clusterGroups {
		l.wg.Add(1)
		go l.caller(i, m, clusterOrdered, fmt.Sprintf("key-%d", g), fmt.Sprintf("m%d-o%d", i, g))
	}
	for c := range 4 {
		l.wg.Add(1)
		go l.caller(i, m, clusterUnordered, "", fmt.Sprintf("m%d-a%d", i, c))
	}
}

// kill stops member i's callers, as its process died with them.
func (l *clusterLoad) kill(i int) { l.killed.Store(int64(i + 1)) }

func (l *clusterLoad) caller(i int, m *clusterMember, topic, group, name string) {
	defer l.wg.Done()
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return
		default:
		}
		key := fmt.Sprintf("%s-%d", name, seq)
		rec := &sentMessage{group: group, submitted: time.Now()}
		l.mu.Lock()
		l.sent[key] = rec
		l.mu.Unlock()
		msg := codec.Message{Group: group, IdempotencyKey: key, Body: []byte(key)}
		for {
			if l.killed.Load() == int64(i+1) {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := m.node.Deliver(ctx, topic, msg)
			cancel()
			l.mu.Lock()
			l.attempts++
			if err == nil {
				rec.acked, rec.id = time.Now(), id
				l.mu.Unlock()
				break
			}
			if l.errs == nil {
				l.errs = map[string]int{}
			}
			l.errs[clusterErrorClass(err)]++
			l.mu.Unlock()
			if codec.IsPermanent(err) {
				break
			}
			select {
			case <-l.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

func clusterErrorClass(err error) string {
	switch {
	case errors.Is(err, clustered.ErrUnreachable):
		return "unreachable"
	case codec.IsPermanent(err):
		return "permanent"
	}
	return "retryable"
}

// report reads the topics back and prints the summary; it returns the exit
// code.
func (l *clusterLoad) report(w io.Writer, srv *clusterServer, elapsed, killed time.Duration, leaveErr error) int {
	stored := srv.srv.Messages()
	count := map[string]int{}
	byKey := map[string][]string{} // ordering key → idempotency keys in stored order
	for _, m := range stored {
		key := string(m.Data)
		count[key]++
		if m.OrderingKey != "" && count[key] == 1 {
			byKey[m.OrderingKey] = append(byKey[m.OrderingKey], key)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	acked, lost, dups := 0, 0, 0
	for key, rec := range l.sent {
		if !rec.acked.IsZero() {
			acked++
			if count[key] == 0 {
				lost++
			}
		}
	}
	for _, n := range count {
		if n > 1 {
			dups += n - 1
		}
	}
	// A violation: within an ordering key, a message acknowledged before
	// another was first submitted, yet stored after it. Walk each key's
	// stored order backwards, keeping the earliest acknowledgement seen.
	violations := 0
	for _, keys := range byKey {
		var earliest time.Time
		for i := len(keys) - 1; i >= 0; i-- {
			rec := l.sent[keys[i]]
			if rec == nil {
				continue
			}
			if !earliest.IsZero() && earliest.Before(rec.submitted) {
				violations++
			}
			if !rec.acked.IsZero() && (earliest.IsZero() || rec.acked.Before(earliest)) {
				earliest = rec.acked
			}
		}
	}
	classes := make([]string, 0, len(l.errs))
	for c := range l.errs {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	fmt.Fprintf(w, "\nran %v; member killed at %v\n", elapsed.Round(time.Millisecond), killed.Round(time.Millisecond))
	fmt.Fprintf(w, "  acknowledged       %d (%.0f/s), in %d attempts\n", acked, float64(acked)/elapsed.Seconds(), l.attempts)
	for _, c := range classes {
		fmt.Fprintf(w, "  answered %-11s %d (retried with the same key)\n", c, l.errs[c])
	}
	reqs := srv.requests.Load()
	if reqs > 0 {
		fmt.Fprintf(w, "  Publish requests   %d, %.1f entries per request\n", reqs, float64(len(stored))/float64(reqs))
	}
	fmt.Fprintf(w, "  same-key overlaps  %d (a Publish arriving while another of its ordering key was being served)\n", srv.overlaps.Load())
	if leaveErr != nil {
		fmt.Fprintf(w, "  leave: %v\n", leaveErr)
	}
	fmt.Fprintf(w, "lost: %d\norder violations: %d\nduplicates: %d\n", lost, violations, dups)
	if lost > 0 || violations > 0 || leaveErr != nil {
		return 1
	}
	return 0
}

// clusterServer is pstest behind a gRPC server of the demo's own that takes
// clusterLatency per Publish and counts requests, and Publishes of one
// ordering key served at once.
type clusterServer struct {
	srv      *pstest.Server
	g        *grpc.Server
	addr     string
	done     chan struct{}
	mu       sync.Mutex
	running  map[string]int
	requests atomic.Int64
	overlaps atomic.Int64
}

func newClusterServer() (*clusterServer, error) {
	s := &clusterServer{srv: pstest.NewServer(), running: map[string]int{}, done: make(chan struct{})}
	for _, topic := range []string{clusterOrdered, clusterUnordered} {
		if _, err := s.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: clusterProject + "/topics/" + topic}); err != nil {
			_ = s.srv.Close()
			return nil, err
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = s.srv.Close()
		return nil, err
	}
	s.g = grpc.NewServer(grpc.UnaryInterceptor(s.intercept))
	pubsubpb.RegisterPublisherServer(s.g, &s.srv.GServer)
	go func() { defer close(s.done); _ = s.g.Serve(lis) }()
	s.addr = lis.Addr().String()
	return s, nil
}

func (s *clusterServer) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	p, ok := req.(*pubsubpb.PublishRequest)
	if !ok {
		return handler(ctx, req)
	}
	s.requests.Add(1)
	key := ""
	if len(p.Messages) > 0 {
		key = p.Messages[0].OrderingKey
	}
	if key != "" {
		s.mu.Lock()
		if s.running[key] > 0 {
			s.overlaps.Add(1)
		}
		s.running[key]++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			if s.running[key]--; s.running[key] == 0 {
				delete(s.running, key)
			}
			s.mu.Unlock()
		}()
	}
	t := time.NewTimer(clusterLatency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return handler(ctx, req)
}

func (s *clusterServer) close() {
	s.g.Stop()
	<-s.done
	_ = s.srv.Close()
}

// clusterCA is the certificate authority the demo makes for its members.
type clusterCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newClusterCA() (*clusterCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sinkbatch demo cluster CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &clusterCA{cert: cert, key: key, pool: pool}, nil
}

// member issues a member certificate for serving and dialling.
func (ca *clusterCA) member(serial int64) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprintf("member %d", serial)},
		DNSNames:  []string{clusterServerName},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// freeLoopbackPort is a loopback port nobody listens on now.
func freeLoopbackPort() (int, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port, nil
}
