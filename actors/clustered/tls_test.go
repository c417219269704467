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
	"fmt"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/actors/clustered/clusterpb"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// authority is a certificate authority made for one test.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newAuthority(t testing.TB, name string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pool: pool}
}

// member issues a member certificate, for serving and dialling, valid for
// the cluster's server name.
func (a *authority) member(t testing.TB, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: fmt.Sprintf("member-%d", serial)},
		DNSNames:     []string{"sinkbatch-cluster"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestMutualTLS: members with certificates from the cluster's authority
// deliver to each other; a peer whose certificate comes from another
// authority is listed by the provider, but no delivery reaches it and none
// of its own reaches a member. A member listening beyond loopback without
// TLS is warned about at Attach; one with TLS is not.
func TestMutualTLS(t *testing.T) {
	ca, other := newAuthority(t, "cluster"), newAuthority(t, "stranger")
	agent := test.NewInMemAgent()
	var logs testinst.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	start := func(cfg *tls.Config, o memberOpts) *member {
		port := freePort(t)
		o.provider = test.NewTestProvider(agent, test.WithTestProviderServiceTtl(time.Second), test.WithTestProviderRefreshTtl(100*time.Millisecond))
		o.host, o.port, o.noCleanup, o.logger, o.retries = "0.0.0.0", port, true, logger, 1
		o.remote = append(clustered.TLSOptions(cfg),
			remote.WithAdvertisedHost(fmt.Sprintf("127.0.0.1:%d", port)))
		return startMember(t, names(12), o)
	}
	// The stranger trusts the cluster's authority, so it can verify the
	// members' certificates: only its own certificate keeps it out.
	stranger := clustered.MutualTLS(other.pool, other.member(t, 4), "sinkbatch-cluster")
	stranger.RootCAs = ca.pool
	ms := []*member{
		start(clustered.MutualTLS(ca.pool, ca.member(t, 2), "sinkbatch-cluster"), memberOpts{}),
		start(clustered.MutualTLS(ca.pool, ca.member(t, 3), "sinkbatch-cluster"), memberOpts{}),
		start(stranger, memberOpts{}),
	}
	t.Cleanup(func() { leaveAll(t, ms) })
	waitMembers(t, ms, 3)
	assert.Zero(t, logs.Count("without transport credentials"), "a member with TLS was warned about")

	rogue := ms[2]
	dests := names(6)
	type outcome struct {
		name       string
		from       *member
		err        error
		toOrFromIt bool
		itself     bool // the stranger to itself, with its own credentials: none of the cluster's business
	}
	results := make(chan outcome, len(dests)*len(ms))
	for _, name := range dests {
		owner, _ := ownerOf(t, ms, name)
		for _, from := range ms {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := from.node.Deliver(ctx, name, codec.Message{Body: []byte(fmt.Sprintf("from %s", from.system.Address()))})
				results <- outcome{name: name, from: from, err: err, toOrFromIt: owner == rogue || from == rogue, itself: owner == rogue && from == rogue}
			}()
		}
	}
	for range len(dests) * len(ms) {
		r := <-results
		switch {
		case r.itself:
		case r.toOrFromIt:
			assert.ErrorIs(t, r.err, clustered.ErrUnreachable, "%s to or from the stranger", r.name)
		default:
			assert.NoError(t, r.err, "%s from a member to a member", r.name)
		}
	}
	for _, name := range dests {
		for _, sent := range rogue.fake(name).Sent() {
			assert.Equal(t, "from "+rogue.system.Address(), string(sent.Body), "the stranger sent a member's message")
		}
		for _, m := range ms[:2] {
			for _, sent := range m.fake(name).Sent() {
				assert.NotEqual(t, "from "+rogue.system.Address(), string(sent.Body), "the stranger's message was sent")
			}
		}
	}

	// The stranger cannot wait for answers (the members cannot dial it), but
	// a one-way delivery sent straight to a grain would be batched if the
	// members let its connection in.
	var target string
	var owner *member
	for _, name := range dests {
		if o, _ := ownerOf(t, ms, name); o != rogue {
			target, owner = name, o
			break
		}
	}
	f := owner.system.Root.RequestFuture(actor.NewPID(owner.system.Address(), disthash.PartitionActivatorActorName),
		&cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Identity: target, Kind: clustered.Kind}}, 5*time.Second)
	res, err := f.Result()
	require.NoError(t, err)
	// A fresh PID: the one in the answer caches the owner's local process,
	// which would let the send skip the network.
	pid := res.(*cluster.ActivationResponse).Pid
	grain := actor.NewPID(pid.Address, pid.Id)
	rogue.system.Root.Send(grain, &clusterpb.DeliverBatch{Destination: target, Requests: []*clusterpb.DeliverRequest{
		{Body: []byte("sneaked"), BudgetNanos: int64(time.Minute)},
	}})
	assert.Never(t, func() bool {
		for _, sent := range owner.fake(target).Sent() {
			if string(sent.Body) == "sneaked" {
				return true
			}
		}
		return false
	}, 2*time.Second, 20*time.Millisecond, "a one-way delivery from the stranger was sent")

	// A member listening beyond loopback in plaintext is warned about.
	port := freePort(t)
	plain := startMember(t, names(1), memberOpts{
		provider: test.NewTestProvider(test.NewInMemAgent()),
		host:     "0.0.0.0", port: port, noCleanup: true, logger: logger,
		remote: []remote.ConfigOption{remote.WithAdvertisedHost(fmt.Sprintf("127.0.0.1:%d", port))},
	})
	ms = append(ms, plain)
	assert.Equal(t, 1, logs.Count("without transport credentials"))
}
