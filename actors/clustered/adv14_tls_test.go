package clustered_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/actors/clustered"
)

// TLSOptions refuses, at set-up, a config that names no CA to verify peers
// by. Before, it took one: the server side required a "verified" client
// certificate with ClientCAs nil, which crypto/tls verifies against the
// system's roots, so a peer with any public CA's client certificate could
// join and deliver, against the package's promise that only holders of
// the cluster's certificate can.
func TestAdv14TLSOptionsRefusesAConfigWithoutCAs(t *testing.T) {
	assert.PanicsWithValue(t, "sinkbatch: clustered.TLSOptions: nil *tls.Config", func() { clustered.TLSOptions(nil) })
	assert.Panics(t, func() { clustered.TLSOptions(&tls.Config{Certificates: []tls.Certificate{{}}}) })
	pool := x509.NewCertPool()
	for _, cfg := range []*tls.Config{{RootCAs: pool}, {ClientCAs: pool}, clustered.MutualTLS(pool, tls.Certificate{}, "cluster")} {
		assert.NotPanics(t, func() { assert.Len(t, clustered.TLSOptions(cfg), 2) })
	}
}
