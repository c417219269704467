package clustered_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/actors/clustered"
)

// TLSOptions refuses, at set-up, a config that names no CA to verify peers
// by, or holds no certificate for the member to present (no peer could
// connect, and the cluster would fail delivery by delivery). Before, it took one: the server side required a "verified" client
// certificate with ClientCAs nil, which crypto/tls verifies against the
// system's roots, so a peer with any public CA's client certificate could
// join and deliver, against the package's promise that only holders of
// the cluster's certificate can.
func TestTLSOptionsRefusesAConfigWithoutCAs(t *testing.T) {
	assert.PanicsWithValue(t, "sinkbatch: clustered.TLSOptions: nil *tls.Config", func() { clustered.TLSOptions(nil) })
	cert := tls.Certificate{Certificate: [][]byte{{1}}} // read by the handshake, not by TLSOptions
	assert.Panics(t, func() { clustered.TLSOptions(&tls.Config{Certificates: []tls.Certificate{cert}}) }, "no CA")
	pool := x509.NewCertPool()
	assert.Panics(t, func() { clustered.TLSOptions(clustered.MutualTLS(pool, tls.Certificate{}, "cluster")) }, "no certificate")
	assert.Panics(t, func() { clustered.TLSOptions(&tls.Config{RootCAs: pool}) }, "no certificate")
	withCert := func(c *tls.Config) *tls.Config { c.Certificates = []tls.Certificate{cert}; return c }
	for _, cfg := range []*tls.Config{withCert(&tls.Config{RootCAs: pool}), withCert(&tls.Config{ClientCAs: pool}), clustered.MutualTLS(pool, cert, "cluster")} {
		assert.NotPanics(t, func() { assert.Len(t, clustered.TLSOptions(cfg), 2) })
	}
}
