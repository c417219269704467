//go:build !race

package clustered_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// TestAnUnknownDestinationLeavesNoGrain: activations of names the owner
// does not configure (a peer's config names them) answer their deliveries
// ErrUnknownDestination, and leave no grain behind; error texts quote at
// most a short prefix of a name.
func TestAnUnknownDestinationLeavesNoGrain(t *testing.T) {
	ms := startTestCluster(t, 2, []string{"known"}, memberOpts{})
	from, to := ms[0], ms[1]
	activator := actor.NewPID(to.system.Address(), disthash.PartitionActivatorActorName)
	owned := 0
	for i := range 200 {
		name := fmt.Sprintf("never-configured-%d", i)
		if o, _ := ownerOf(t, ms, name); o == to {
			owned++
		}
		res, err := from.system.Root.RequestFuture(activator,
			&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: name, Kind: clustered.Kind}}, 5*time.Second).Result()
		require.NoError(t, err)
		require.NotNil(t, res.(*cluster.ActivationResponse).Pid)
	}
	require.Positive(t, owned, "no name the member owns: the test proves nothing")
	require.Eventually(t, func() bool { return to.cluster.GetClusterKind(clustered.Kind).Count() == 0 },
		10*time.Second, 20*time.Millisecond, "grains of names never configured are still alive")

	// An error about a name of 5,000 bytes quotes at most a short prefix
	// of it, and says its length.
	long := strings.Repeat("n", 5000)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := from.node.Deliver(ctx, long, codec.Message{Body: []byte("x")})
	require.ErrorIs(t, err, clustered.ErrUnknownDestination)
	assert.Less(t, len(err.Error()), 200, "%s", err)
	assert.Contains(t, err.Error(), "5000 bytes")
	err = from.node.ResumeGroup(ctx, long, "g")
	require.ErrorIs(t, err, clustered.ErrUnknownDestination)
	assert.Less(t, len(err.Error()), 200)
	_, err = clustered.New(from.system, clustered.Config{Instance: from.inst, Destinations: clustered.Destinations{long + "/": from.codecs["known"]}})
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 200)
}

// TestTLSChecksTheClientCertificatesName: a member's remote with
// TLSOptions lets in a client whose certificate the cluster's CA signed
// for the cluster's name, and refuses one the same CA signed for another
// name (a CA shared with other services).
func TestTLSChecksTheClientCertificatesName(t *testing.T) {
	ca := newAuthority(t, "cluster")
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	r := remote.NewRemote(system, remote.Configure("127.0.0.1", freePort(t),
		clustered.TLSOptions(clustered.MutualTLS(ca.pool, ca.member(t, 2), "sinkbatch-cluster"))...))
	r.Start()
	defer r.Shutdown(false)
	connects := func(cert tls.Certificate) error {
		cfg := &tls.Config{RootCAs: ca.pool, ServerName: "sinkbatch-cluster", Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
		conn, err := grpc.NewClient(system.Address(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := remote.NewRemotingClient(conn).Receive(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{
			ConnectRequest: &remote.ConnectRequest{ConnectionType: &remote.ConnectRequest_ServerConnection{
				ServerConnection: &remote.ServerConnection{SystemId: "probe", Address: "127.0.0.1:1"}}}}}); err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	require.NoError(t, connects(ca.member(t, 3)), "a member's certificate")
	require.Error(t, connects(certFor(t, ca, "other-service")), "the CA's certificate for another service")
}

// certFor is a client certificate that ca signed for name.
func certFor(t *testing.T, ca *authority, name string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(99),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestAStrangerDoesNotStallHandOffs: a process answering a listed health
// port as a member hosting Kind, whose remote port accepts connections and
// says nothing, delays the first delivery to a fresh destination a real
// member owns by about the hand-off's bound for silent members, not the
// MaxRetryCount dials of 2 s each that protoactor makes before it gives a
// message to it up.
func TestAStrangerDoesNotStallHandOffs(t *testing.T) {
	c := newManaged(t, 3)
	// Slot 2 is the stranger.
	silent, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", c.remotes[2]))
	require.NoError(t, err)
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, conn)
			heldMu.Unlock()
		}
	}()
	health := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "stranger", "address": "127.0.0.1", "port": c.remotes[2],
			"auto_manage_port": c.health[2], "kinds": []string{clustered.Kind}, "cluster_name": "sinkbatch-test"})
	})}
	hl, err := net.Listen("tcp", c.hosts[2])
	require.NoError(t, err)
	go func() { _ = health.Serve(hl) }()
	closeStranger := func() {
		_ = health.Close()
		_ = silent.Close()
		heldMu.Lock()
		for _, conn := range held {
			_ = conn.Close()
		}
		heldMu.Unlock()
	}
	t.Cleanup(closeStranger)

	var logs testinst.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ms := []*member{
		c.start(t, 0, names(40), memberOpts{logger: logger, retries: 1}),
		c.start(t, 1, names(40), memberOpts{logger: logger, retries: 1}),
	}
	t.Cleanup(func() {
		// protoactor's shutdown waits for its endpoint writer to the
		// stranger until its connection ends.
		closeStranger()
		for _, m := range ms {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_ = m.node.Leave(ctx)
			_ = m.inst.Stop(ctx)
			cancel()
			m.gone = true
		}
	})
	waitMembers(t, ms, 3)
	assert.Zero(t, logs.Count("MaxRetryCount above 1"), "a MaxRetryCount of 1 was warned about")
	var dest string
	for _, name := range names(40) {
		if o := c.owner(name, 0, 1, 2); o == 0 {
			dest = name
			break
		}
	}
	require.NotEmpty(t, dest)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = ms[1].node.Deliver(ctx, dest, codec.Message{Body: []byte("x")})
	require.NoError(t, err, "the first delivery to a fresh destination waited for the stranger")
	t.Logf("first delivery to a fresh destination took %v", time.Since(start))
}

// TestAttachWarnsAboutMaxRetryCount: a member whose remote keeps
// protoactor's default MaxRetryCount (5) is warned about at Attach
// (TestAStrangerDoesNotStallHandOffs checks that one with 1 is not).
func TestAttachWarnsAboutMaxRetryCount(t *testing.T) {
	var logs testinst.Buffer
	startTestCluster(t, 1, []string{"d"}, memberOpts{logger: slog.New(slog.NewTextHandler(&logs, nil))})
	assert.Equal(t, 1, logs.Count("MaxRetryCount above 1"))
}

// TestResumeGroupAsksOnlyAMemberThatTakesIt: ResumeGroup toward an owner
// whose node answers no lease probe (a version before them, which may not
// know GroupsRequest: a message of a type it does not know would end its
// stream) is not sent, and ends with an error that says so; toward an
// owner that answers probes it works.
func TestResumeGroupAsksOnlyAMemberThatTakesIt(t *testing.T) {
	agent := test.NewInMemAgent()
	start := func(o memberOpts) *member {
		o.provider = test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
		o.noCleanup = true
		return startMember(t, names(32), o)
	}
	ms := []*member{start(memberOpts{}), start(memberOpts{noLeases: true})}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 2)
	earlier := ms[1]
	var toEarlier, toCurrent string
	// 32 names: with random ports, 8 all hashed to one member in about
	// 1 run of 128.
	for _, name := range names(32) {
		if o, _ := ownerOf(t, ms, name); o == earlier {
			toEarlier = name
		} else {
			toCurrent = name
		}
	}
	require.NotEmpty(t, toEarlier)
	require.NotEmpty(t, toCurrent)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.NoError(t, earlier.node.ResumeGroup(ctx, toCurrent, "g"), "the earlier member asks a current one")
	err := ms[0].node.ResumeGroup(ctx, toEarlier, "g")
	require.ErrorIs(t, err, clustered.ErrUnreachable)
	assert.Contains(t, err.Error(), "earlier version")
}
