package clustered

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// MutualTLS is a *tls.Config for a cluster whose members all hold a
// certificate signed by ca: cert is this member's, presented both when it
// serves and when it dials; peers must present one signed by ca too, and
// the certificate a member serves must be valid for serverName (one name
// for the whole cluster, since members dial each other by IP address).
func MutualTLS(ca *x509.CertPool, cert tls.Certificate, serverName string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      ca,
		ClientCAs:    ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   serverName,
		MinVersion:   tls.VersionTLS13,
	}
}

// TLSOptions are the options that make protoactor's remote serve and dial
// with cfg: pass them to remote.Configure. A cluster member's remote port
// accepts deliveries to every destination, so give members a cfg that
// requires and verifies client certificates (MutualTLS does), or anyone who
// can reach the port can publish with this member's credentials. cfg is
// cloned. The server side always requires a verified client certificate,
// verified against cfg.ClientCAs (cfg.RootCAs when that is nil); the
// dialling side verifies the server's against cfg.RootCAs (cfg.ClientCAs
// when that is nil), so that a member sends deliveries only to a server
// holding a certificate of the cluster's CA.
//
// TLSOptions panics, at set-up, if cfg is nil, names no CA to verify peers
// by (ClientCAs and RootCAs both nil: Go would then verify peers against
// the system's roots, and let in, or dial, any peer holding a certificate
// from a public CA; to trust those on purpose, set ClientCAs to
// x509.SystemCertPool()), has no certificate for the member to serve
// (Certificates, GetCertificate or GetConfigForClient) or to present when
// it dials (Certificates or GetClientCertificate), or skips verifying the
// servers it dials (InsecureSkipVerify without VerifyPeerCertificate or
// VerifyConnection to verify them instead). The options include
// GuardReceive.
//
// When cfg.ServerName is set (MutualTLS sets it to the cluster's name), the
// server side also requires the client's certificate to be valid for that
// name, as the dialling side requires the server's: a CA that also signs
// for other services does not let them in.
func TLSOptions(cfg *tls.Config) []remote.ConfigOption {
	if cfg == nil {
		panic("sinkbatch: clustered.TLSOptions: nil *tls.Config")
	}
	hasCert := len(cfg.Certificates) > 0 && len(cfg.Certificates[0].Certificate) > 0
	switch {
	case cfg.ClientCAs == nil && cfg.RootCAs == nil:
		panic("sinkbatch: clustered.TLSOptions: the *tls.Config has neither ClientCAs nor RootCAs, so any certificate a public CA signed would be trusted; use MutualTLS, or set ClientCAs")
	case !hasCert && cfg.GetCertificate == nil && cfg.GetConfigForClient == nil:
		panic("sinkbatch: clustered.TLSOptions: the *tls.Config has no certificate for this member to serve (Certificates or GetCertificate): no peer could connect to it")
	case !hasCert && cfg.GetClientCertificate == nil:
		panic("sinkbatch: clustered.TLSOptions: the *tls.Config has no certificate for this member to present when it dials (Certificates or GetClientCertificate): no peer would let it connect")
	case cfg.InsecureSkipVerify && cfg.VerifyPeerCertificate == nil && cfg.VerifyConnection == nil:
		panic("sinkbatch: clustered.TLSOptions: the *tls.Config has InsecureSkipVerify and nothing else to verify the servers it dials by, so this member would send deliveries to any server the provider lists")
	}
	server := cfg.Clone()
	if server.ClientCAs == nil {
		server.ClientCAs = server.RootCAs
	}
	server.ClientAuth = tls.RequireAndVerifyClientCert
	if name := cfg.ServerName; name != "" {
		// A CA that signs for other services too would let all of them in:
		// a client must hold a certificate valid for the cluster's name.
		verify := cfg.VerifyConnection
		server.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("sinkbatch: cluster peer presented no certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(name); err != nil {
				return fmt.Errorf("sinkbatch: cluster peer's certificate is not for the cluster's name: %w", err)
			}
			if verify != nil {
				return verify(cs)
			}
			return nil
		}
	}
	client := cfg.Clone()
	if client.RootCAs == nil {
		client.RootCAs = client.ClientCAs
	}
	guard := GuardReceive()
	return []remote.ConfigOption{
		func(c *remote.Config) {
			guard(c)
			addServerOptions(grpc.Creds(credentials.NewTLS(server)))(c)
		},
		remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(client))),
	}
}

// ReceiveLimit is the option that makes protoactor's remote accept gRPC
// messages of up to n bytes (gRPC's default is 4 MiB): pass it to
// remote.Configure on every member, and set Config.MaxWireBytes to the same
// n. Like TLSOptions' server option it adds to the server options given
// before it; remote.WithServerOptions, given after either, replaces them.
// It includes GuardReceive.
func ReceiveLimit(n int) remote.ConfigOption {
	guard := GuardReceive()
	return func(c *remote.Config) {
		guard(c)
		addServerOptions(grpc.MaxRecvMsgSize(n))(c)
	}
}

// addServerOptions adds opts to the remote's gRPC server options.
func addServerOptions(opts ...grpc.ServerOption) remote.ConfigOption {
	return func(c *remote.Config) { c.ServerOptions = append(c.ServerOptions, opts...) }
}

// servesWithoutClientCert reports whether the gRPC server at address
// completes a TLS handshake, and answers HTTP/2, for a client without a
// certificate it can verify: one that presents none, or one that presents
// a certificate it made itself a moment ago (a server that requires any
// certificate but verifies none). Either way, anyone may use it. It does
// not check the server's certificate, only whether the server checks the
// client's.
func servesWithoutClientCert(address string) bool {
	probe := func(cfg *tls.Config) bool {
		// A probe of the server's checks: nothing it says is trusted.
		cfg.InsecureSkipVerify, cfg.NextProtos = true, []string{"h2"}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: cfg}
		return answersAt(address, func(a string) (net.Conn, error) { return d.Dial("tcp", a) })
	}
	if probe(&tls.Config{}) {
		return true
	}
	stranger, err := selfSigned()
	return err == nil && probe(&tls.Config{Certificates: []tls.Certificate{stranger}})
}

// selfSigned is a client certificate nobody issued: a fresh key signing
// its own certificate.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "sinkbatch-probe"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// servesPlaintext reports whether the gRPC server at address answers
// HTTP/2 without TLS (a TLS server answers the preface with an alert, or
// closes). It judges the server by what it does, however its credentials
// were configured.
func servesPlaintext(address string) bool {
	return answersAt(address, func(a string) (net.Conn, error) { return net.DialTimeout("tcp", a, 2*time.Second) })
}

// answersAt reports whether the server at address answers HTTP/2 on a
// connection dial makes: it sends the HTTP/2 client preface and an empty
// SETTINGS frame, and looks for the server's SETTINGS frame.
func answersAt(address string, dial func(hostport string) (net.Conn, error)) bool {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	conn, err := dial(net.JoinHostPort(host, port))
	if err != nil {
		// An advertised address may not route back to the member itself.
		if conn, err = dial(net.JoinHostPort("127.0.0.1", port)); err != nil {
			return false
		}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
	if _, err := conn.Write(preface); err != nil {
		return false
	}
	frame := make([]byte, 9)
	if _, err := io.ReadFull(conn, frame); err != nil {
		return false
	}
	const settings = 4
	return frame[3] == settings && bytes.Equal(frame[5:9], []byte{0, 0, 0, 0})
}
