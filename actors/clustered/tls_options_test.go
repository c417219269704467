//go:build !race

package clustered_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/ankusa/sinkbatch/actors/clustered"
)

// systemRootsMarker tells the test's own process apart from the process
// it starts with system roots of its own.
const systemRootsMarker = "SINKBATCH_TEST_OWN_SYSTEM_ROOTS"

// A member whose *tls.Config names only ClientCAs (the CA it verifies its
// peers' client certificates by) verifies the servers it dials by that CA
// too. Before, TLSOptions left the dialling side's RootCAs nil, so Go
// verified the servers a member dialled against the system's roots: a
// server holding a certificate a public CA signed for the cluster's
// server name was dialled, and would have been sent every delivery the
// provider's topology routed to it. The test runs in a process of its
// own whose system roots are one CA it makes (SSL_CERT_FILE), which
// stands for a public CA.
func TestTLSOptionsVerifiesServersByTheClusterCA(t *testing.T) {
	if os.Getenv(systemRootsMarker) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), systemRootsMarker+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "in a process of its own:\n%s", out)
		require.Contains(t, string(out), "--- PASS: "+t.Name(), "in a process of its own:\n%s", out)
		return
	}
	public := newAuthority(t, "a public CA")
	dir := t.TempDir()
	roots := filepath.Join(dir, "roots.pem")
	require.NoError(t, os.WriteFile(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: public.cert.Raw}), 0o600))
	require.NoError(t, os.Setenv("SSL_CERT_FILE", roots))
	require.NoError(t, os.Setenv("SSL_CERT_DIR", dir))
	impostor := public.member(t, 9) // valid for the cluster's server name
	system, err := x509.SystemCertPool()
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(impostor.Certificate[0])
	require.NoError(t, err)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: system, DNSName: "sinkbatch-cluster"})
	require.NoError(t, err, "the process's system roots do not trust the stand-in public CA")

	// The impostor serves gRPC with its certificate and asks for none.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{impostor}})))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	dial := func(cfg *tls.Config) connectivity.State {
		rc := remote.Configure("127.0.0.1", 0, clustered.TLSOptions(cfg)...)
		conn, err := grpc.NewClient(lis.Addr().String(), rc.DialOptions...)
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn.Connect()
		for {
			s := conn.GetState()
			if s == connectivity.Ready || s == connectivity.TransientFailure || !conn.WaitForStateChange(ctx, s) {
				return s
			}
		}
	}
	ca := newAuthority(t, "cluster")
	// The control: a member that trusts the public CA reaches the impostor.
	assert.Equal(t, connectivity.Ready, dial(clustered.MutualTLS(public.pool, ca.member(t, 2), "sinkbatch-cluster")))
	for name, cfg := range map[string]*tls.Config{
		"ClientCAs only":   {ClientCAs: ca.pool, Certificates: []tls.Certificate{ca.member(t, 3)}, ServerName: "sinkbatch-cluster"},
		"the cluster's CA": clustered.MutualTLS(ca.pool, ca.member(t, 4), "sinkbatch-cluster"),
	} {
		assert.Equal(t, connectivity.TransientFailure, dial(cfg), "%s: a member dialled a server whose certificate is not the cluster CA's", name)
	}
}

// TLSOptions refuses, at set-up, a config with which a member could not
// serve, could not dial, or would dial any server: with only
// GetCertificate (a rotating server certificate) it presented no
// certificate when it dialled, so every peer refused it and each delivery
// through it failed, one by one, with ErrUnreachable; with
// InsecureSkipVerify and no verifier of its own it sent deliveries to any
// server the provider listed. Configs that serve, dial and verify are
// taken, rotating certificates included.
func TestTLSOptionsRefusesWhatCannotServeDialOrVerify(t *testing.T) {
	pool := x509.NewCertPool()
	cert := tls.Certificate{Certificate: [][]byte{{1}}} // read by the handshake, not by TLSOptions
	serve := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
	present := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	verify := func([][]byte, [][]*x509.Certificate) error { return nil }
	for name, cfg := range map[string]*tls.Config{
		"GetCertificate only":       {ClientCAs: pool, GetCertificate: serve},
		"GetClientCertificate only": {ClientCAs: pool, GetClientCertificate: present},
		"InsecureSkipVerify":        {ClientCAs: pool, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true},
	} {
		assert.Panics(t, func() { clustered.TLSOptions(cfg) }, name)
	}
	for name, cfg := range map[string]*tls.Config{
		"rotating certificates": {ClientCAs: pool, GetCertificate: serve, GetClientCertificate: present},
		"a verifier of its own": {ClientCAs: pool, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, VerifyPeerCertificate: verify},
		"per-client configs":    {RootCAs: pool, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return nil, nil }, GetClientCertificate: present},
	} {
		assert.NotPanics(t, func() { assert.Len(t, clustered.TLSOptions(cfg), 2) }, name)
	}
}
