package transport

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/pki"
)

func (w *tlsWorld) unixServer(path string, leaf *pki.Leaf) TLS {
	return TLS{Path: path, CA: w.ca.Cert, Certificate: leaf.TLSCertificate(), HandshakeTimeout: 2 * time.Second}
}

func (w *tlsWorld) unixClient(path string, leaf *pki.Leaf) TLS {
	return TLS{Path: path, CA: w.ca.Cert, Certificate: leaf.TLSCertificate(), ServerName: "receiver.test"}
}

// TestTLSUnixRoundTrip: mutual TLS runs over a unix socket, whose file
// gets the configured mode; impostors are refused as over TCP.
func TestTLSUnixRoundTrip(t *testing.T) {
	w := newTLSWorld(t)
	path := socketPath(t)
	srv := w.unixServer(path, w.server)
	srv.SocketMode = 0o660
	l := listenTLS(t, srv)
	if l.Addr() != path {
		t.Fatalf("Addr %q, want %q", l.Addr(), path)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o660 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %v %v", fi, err)
	}
	if err := exchange(t, l, w.unixClient(path, w.client)); err != nil {
		t.Fatal(err)
	}
	if err := exchange(t, l, w.unixClient(path, w.rClient)); err == nil {
		t.Fatal("client certificate of a rogue CA accepted over the unix socket")
	}
	rogue := listenTLS(t, w.unixServer(socketPath(t), w.rServer))
	if err := exchange(t, rogue, w.unixClient(rogue.Addr(), w.client)); err == nil {
		t.Fatal("server certificate of a rogue CA accepted over the unix socket")
	}
}

// TestTLSUnixPeerUID: a peer whose uid is not allowed is dropped before
// any handshake, on either side.
func TestTLSUnixPeerUID(t *testing.T) {
	w := newTLSWorld(t)
	path := socketPath(t)
	srv := w.unixServer(path, w.server)
	srv.PeerUIDs = []uint32{uint32(os.Geteuid()) + 4242}
	l := listenTLS(t, srv)
	if err := exchange(t, l, w.unixClient(path, w.client)); err == nil {
		t.Fatal("a client whose uid is not allowed completed an exchange")
	}
	open := listenTLS(t, w.unixServer(socketPath(t), w.server))
	c := w.unixClient(open.Addr(), w.client)
	c.PeerUIDs = []uint32{uint32(os.Geteuid()) + 4242}
	if _, err := c.Dial(testCtx(t)); !errors.Is(err, ErrPeerRefused) {
		t.Fatalf("dial to a listener whose uid is not allowed: %v, want ErrPeerRefused", err)
	}
}

// TestTLSUnixConfig: a tls channel takes a path or an address, never
// both; socket settings need the path.
func TestTLSUnixConfig(t *testing.T) {
	w := newTLSWorld(t)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := w.ca.WriteCert(ca); err != nil {
		t.Fatal(err)
	}
	cert, key, err := w.server.WriteFiles(dir, "receiver")
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Kind: KindTLS, CAFile: ca, CertFile: cert, KeyFile: key}
	ok := base
	ok.Path, ok.SocketMode, ok.PeerUIDs = dir+"/r.sock", 0o600, []uint32{0}
	var tr Transport
	tr, err = ok.Transport(nil)
	if err != nil || tr.String() != "tls+unix:"+dir+"/r.sock" {
		t.Fatalf("tls over a unix path: %v %v", tr, err)
	}
	for name, c := range map[string]Config{
		"both":              func() Config { c := ok; c.Address = "127.0.0.1:1"; return c }(),
		"neither":           base,
		"mode without path": func() Config { c := base; c.Address = "127.0.0.1:1"; c.SocketMode = 0o600; return c }(),
		"uids without path": func() Config { c := base; c.Address = "127.0.0.1:1"; c.PeerUIDs = []uint32{0}; return c }(),
		"relative path":     func() Config { c := base; c.Path = "r.sock"; return c }(),
	} {
		if _, err := c.Transport(nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
