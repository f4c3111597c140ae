package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"
)

// DefaultHandshakeTimeout bounds one TLS handshake.
const DefaultHandshakeTimeout = 10 * time.Second

// maxHandshakes bounds the handshakes a listener runs at once; a
// connection beyond it is closed at once.
const maxHandshakes = 32

// TLS is TCP with mutual TLS 1.3 (no other version). Each side requires a
// certificate from the other and accepts it only if it is signed directly
// by CA (no intermediates), CA's public key matches the pin, and the
// certificate is valid now and carries the right extended key usage
// (serverAuth for the receiver, clientAuth for the custodian). No system
// roots are ever consulted. Session tickets are off, so every connection
// runs the full verification.
type TLS struct {
	// Address is host:port to dial or listen on. Path, instead, carries
	// the same mutual TLS over a unix socket (see tlsunix.go); exactly one
	// of the two is set.
	Address string
	// Path is the unix socket's absolute path; SocketMode and PeerUIDs
	// are as in Unix (0 means 0600; empty means root and this process's
	// effective uid), checked with SO_PEERCRED before any handshake.
	Path       string
	SocketMode fs.FileMode
	PeerUIDs   []uint32
	// CA is the one issuer both peers' certificates must be signed by.
	CA *x509.Certificate
	// CASPKISHA256, if set, is the hex SHA-256 of CA's SubjectPublicKeyInfo;
	// a CA whose key does not match is refused at Dial and Listen.
	CASPKISHA256 string
	// Certificate is this side's certificate and key.
	Certificate tls.Certificate
	// ServerName is what the receiver's certificate must name (DNS name or
	// IP address); required to Dial.
	ServerName string
	// HandshakeTimeout overrides DefaultHandshakeTimeout when positive.
	HandshakeTimeout time.Duration
	// HelloTimeout overrides DefaultHelloTimeout when positive: a peer
	// whose ClientHello has not arrived by then is dropped (Listen).
	HelloTimeout time.Duration
	// Log receives refused handshakes on Listen; nil discards.
	Log *slog.Logger
}

var _ Transport = TLS{}

func (t TLS) String() string {
	if t.Path != "" {
		return "tls+unix:" + t.Path
	}
	return "tls:" + t.Address
}

// LoadTLS reads the PEM files of a TLS transport: caFile holds exactly one
// CA certificate; certFile this side's certificate and keyFile its key.
// The caller sets ServerName (to dial) and CASPKISHA256 (optional) on the
// result.
func LoadTLS(address, caFile, certFile, keyFile string) (TLS, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return TLS{}, fmt.Errorf("transport: tls CA: %w", err)
	}
	block, rest := pem.Decode(caPEM)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return TLS{}, fmt.Errorf("%w: %s must hold exactly one PEM certificate", ErrConfig, caFile)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return TLS{}, fmt.Errorf("%w: %s: %w", ErrConfig, caFile, err)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid {
		return TLS{}, fmt.Errorf("%w: %s is not a CA certificate", ErrConfig, caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return TLS{}, fmt.Errorf("%w: tls key pair: %w", ErrConfig, err)
	}
	return TLS{Address: address, CA: ca, Certificate: cert}, nil
}

// config builds the tls.Config of one side.
func (t TLS) config(server bool) (*tls.Config, error) {
	switch {
	case t.CA == nil:
		return nil, fmt.Errorf("%w: tls: no CA", ErrConfig)
	case !t.CA.IsCA || !t.CA.BasicConstraintsValid:
		return nil, fmt.Errorf("%w: tls: the configured CA certificate is not a CA", ErrConfig)
	case len(t.Certificate.Certificate) == 0 || t.Certificate.PrivateKey == nil:
		return nil, fmt.Errorf("%w: tls: no certificate and key of our own", ErrConfig)
	case !server && t.ServerName == "":
		return nil, fmt.Errorf("%w: tls: ServerName is required to dial", ErrConfig)
	case (t.Address == "") == (t.Path == ""):
		return nil, fmt.Errorf("%w: tls: exactly one of address and path is required", ErrConfig)
	}
	pin := spkiSHA256(t.CA)
	if t.CASPKISHA256 != "" && t.CASPKISHA256 != pin {
		return nil, fmt.Errorf("%w: tls: CA key sha256 %s does not match the pin %s", ErrConfig, pin, t.CASPKISHA256)
	}
	pool := x509.NewCertPool() // exactly the one issuer; never the system roots
	pool.AddCert(t.CA)
	cfg := &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{t.Certificate},
		SessionTicketsDisabled: true,
	}
	if server {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = pool
		cfg.VerifyConnection = verifyPinned(t.CA, x509.ExtKeyUsageClientAuth)
	} else {
		cfg.RootCAs = pool
		cfg.ServerName = t.ServerName
		cfg.VerifyConnection = verifyPinned(t.CA, x509.ExtKeyUsageServerAuth)
	}
	return cfg, nil
}

func spkiSHA256(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// verifyPinned runs after crypto/tls has verified the peer's chain against
// the one-CA pool. It also requires TLS 1.3, a verified chain of exactly
// [peer, CA] (no intermediate, even one the CA signed) ending at the pinned
// key, and the peer's certificate to list usage explicitly (Go treats a
// certificate without extended key usage as valid for any).
func verifyPinned(ca *x509.Certificate, usage x509.ExtKeyUsage) func(tls.ConnectionState) error {
	want := ca.RawSubjectPublicKeyInfo
	return func(cs tls.ConnectionState) error {
		if cs.Version != tls.VersionTLS13 {
			return &PeerError{Check: "tls version", Peer: tls.VersionName(cs.Version), Want: "TLS 1.3"}
		}
		if len(cs.PeerCertificates) == 0 {
			return &PeerError{Check: "peer certificate", Peer: "none", Want: "one signed by the pinned CA"}
		}
		leaf := cs.PeerCertificates[0]
		if !slices.Contains(leaf.ExtKeyUsage, usage) {
			return &PeerError{Check: "peer certificate extended key usage", Peer: fmt.Sprint(leaf.ExtKeyUsage),
				Want: fmt.Sprintf("a list containing %d", usage)}
		}
		for _, chain := range cs.VerifiedChains {
			if len(chain) == 2 && chain[0].Equal(leaf) && bytes.Equal(chain[1].RawSubjectPublicKeyInfo, want) {
				return nil
			}
		}
		return &PeerError{Check: "peer certificate issuer", Peer: fmt.Sprintf("%q via %d verified chains",
			leaf.Issuer.String(), len(cs.VerifiedChains)), Want: "signed directly by the CA with key sha256 " + spkiSHA256(ca)}
	}
}

// Dial connects and completes the handshake (bounded by ctx and the
// handshake timeout). The receiver verifies our certificate during or just
// after the handshake; a refusal shows as an error on the first read.
func (t TLS) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	cfg, err := t.config(false)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.handshakeTimeout())
	defer cancel()
	if t.Path != "" {
		return t.dialUnix(ctx, cfg)
	}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", t.Address)
	if err != nil {
		return nil, fmt.Errorf("transport: dial tls %s: %w", t.Address, err)
	}
	return c.(*tls.Conn), nil
}

// listenRaw opens the listener the handshakes run on: TCP on Address, or
// the unix socket at Path (listenUnix).
func (t TLS) listenRaw(ctx context.Context) (net.Listener, error) {
	if t.Path != "" {
		return t.listenUnix(ctx)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", t.Address)
	if err != nil {
		return nil, fmt.Errorf("transport: listen tls %s: %w", t.Address, err)
	}
	return ln, nil
}

func (t TLS) handshakeTimeout() time.Duration {
	if t.HandshakeTimeout > 0 {
		return t.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

// Listen listens on Address. Handshakes run in the background, so a peer
// that stalls its handshake cannot hold up others; Accept returns only
// connections whose peer passed verification. Nothing waits for a slot:
// a connection beyond maxHandshakes handshakes at once, or beyond
// maxHandshakesPerPeer from its peer (wire.PeerOf), is closed at once; a
// peer whose ClientHello has not arrived within the hello timeout (1 s)
// is dropped, and the whole handshake is bounded by the handshake timeout.
// Refused peers are logged aggregated (receiver/internal/ratelog).
func (t TLS) Listen(ctx context.Context) (Listener, error) {
	cfg, err := t.config(true)
	if err != nil {
		return nil, err
	}
	ln, err := t.listenRaw(ctx)
	if err != nil {
		return nil, err
	}
	log := t.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return newTLSListener(ln, cfg, t.handshakeTimeout(), t.helloTimeout(), log), nil
}
