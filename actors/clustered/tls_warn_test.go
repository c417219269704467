//go:build !race

package clustered_test

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/internal/testinst"
)

// Attach warns about a member that serves TLS beyond loopback but lets in
// a client without a certificate (server credentials of the user's own,
// without ClientAuth), or with one nobody issued (RequireAnyClientCert):
// anyone who reaches it can publish, as with plaintext. Before, only
// plaintext was warned about. A member with MutualTLS is not warned about.
func TestAttachWarnsAboutTLSWithoutClientCerts(t *testing.T) {
	ca := newAuthority(t, "cluster")
	var logs testinst.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	start := func(opts ...remote.ConfigOption) *member {
		port := freePort(t)
		m := startMember(t, names(1), memberOpts{
			provider: test.NewTestProvider(test.NewInMemAgent()),
			host:     "0.0.0.0", port: port, logger: logger,
			remote: append(opts, remote.WithAdvertisedHost(fmt.Sprintf("127.0.0.1:%d", port))),
		})
		return m
	}
	cert := ca.member(t, 2)
	open := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	start(remote.WithServerOptions(grpc.Creds(credentials.NewTLS(open))),
		remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, ServerName: "sinkbatch-cluster"}))))
	assert.Equal(t, 1, logs.Count("serves TLS beyond loopback without requiring client certificates"), logs.String())
	assert.Zero(t, logs.Count("without transport credentials"))

	// A server that requires a client certificate but verifies none takes
	// one anybody can make.
	anyCert := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13}
	dial := remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, ServerName: "sinkbatch-cluster", Certificates: []tls.Certificate{cert}})))
	start(remote.WithServerOptions(grpc.Creds(credentials.NewTLS(anyCert))), dial)
	assert.Equal(t, 2, logs.Count("serves TLS beyond loopback without requiring client certificates"), "the member taking any certificate was not warned about")

	start(clustered.TLSOptions(clustered.MutualTLS(ca.pool, ca.member(t, 3), "sinkbatch-cluster"))...)
	assert.Equal(t, 2, logs.Count("serves TLS beyond loopback without requiring client certificates"), "the member with mutual TLS was warned about")
	assert.Zero(t, logs.Count("without transport credentials"))
}
