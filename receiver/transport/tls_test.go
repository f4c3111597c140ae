package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/pki"
)

// tlsWorld is one CA with a receiver and a custodian certificate, plus a
// rogue CA that mints look-alikes.
type tlsWorld struct {
	ca, rogue        *pki.CA
	server, client   *pki.Leaf
	rServer, rClient *pki.Leaf
}

func newTLSWorld(t testing.TB) *tlsWorld {
	t.Helper()
	w := &tlsWorld{}
	var err error
	must := func(e error) {
		if e != nil {
			t.Fatal(e)
		}
	}
	w.ca, err = pki.NewCA("tether test CA")
	must(err)
	w.rogue, err = pki.NewCA("tether test CA") // same name, other key
	must(err)
	w.server, err = w.ca.Server("receiver.test", "127.0.0.1")
	must(err)
	w.client, err = w.ca.Client("custodian")
	must(err)
	w.rServer, err = w.rogue.Server("receiver.test", "127.0.0.1")
	must(err)
	w.rClient, err = w.rogue.Client("custodian")
	must(err)
	return w
}

func (w *tlsWorld) serverSide(leaf *pki.Leaf) TLS {
	return TLS{Address: "127.0.0.1:0", CA: w.ca.Cert, Certificate: leaf.TLSCertificate(), HandshakeTimeout: 2 * time.Second}
}

func (w *tlsWorld) clientSide(addr string, leaf *pki.Leaf) TLS {
	return TLS{Address: addr, CA: w.ca.Cert, Certificate: leaf.TLSCertificate(), ServerName: "receiver.test"}
}

func listenTLS(t *testing.T, tr TLS) Listener {
	t.Helper()
	l, err := tr.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// exchange dials with c, and reports whether the listener accepted a
// connection over which one byte travelled each way.
func exchange(t *testing.T, l Listener, c TLS) error {
	t.Helper()
	accepted := make(chan io.ReadWriteCloser, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not a wait
	defer cancel()
	go func() {
		s, err := l.Accept(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		buf := make([]byte, 1)
		io.ReadFull(s, buf)
		s.Write(buf)
		accepted <- s
	}()
	conn, err := c.Dial(testCtx(t))
	if err == nil {
		defer conn.Close()
		if _, err = conn.Write([]byte("x")); err == nil {
			_, err = io.ReadFull(conn, make([]byte, 1))
		}
	}
	if err != nil { // give a wrongly accepted connection time to show up
		time.AfterFunc(300*time.Millisecond, cancel)
	}
	s := <-accepted
	if s != nil {
		s.Close()
	}
	switch {
	case err == nil && s != nil:
		return nil
	case err == nil:
		return errors.New("client exchanged a byte but the listener returned nothing")
	case s != nil:
		return errors.Join(errors.New("listener returned a connection the client failed on"), err)
	}
	return err
}

func TestTLSMutualRoundTrip(t *testing.T) {
	w := newTLSWorld(t)
	l := listenTLS(t, w.serverSide(w.server))
	if err := exchange(t, l, w.clientSide(l.Addr(), w.client)); err != nil {
		t.Fatal(err)
	}
	// The pin, when configured, must match the CA's key.
	c := w.clientSide(l.Addr(), w.client)
	c.CASPKISHA256 = w.ca.SPKISHA256()
	if err := exchange(t, l, c); err != nil {
		t.Fatalf("with the right pin: %v", err)
	}
}

// Every impostor is refused: the listener never returns it and the dialer
// gets an error.
func TestTLSRefusesImpostors(t *testing.T) {
	w := newTLSWorld(t)
	inter, err := w.ca.Intermediate("intermediate")
	if err != nil {
		t.Fatal(err)
	}
	interServer, _ := inter.Server("receiver.test")
	interClient, _ := inter.Client("custodian")
	expired, _ := w.ca.Issue(pki.Template{DNSNames: []string{"receiver.test"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	noEKU, _ := w.ca.Issue(pki.Template{CommonName: "custodian"})
	otherName, _ := w.ca.Server("other.test")

	cases := []struct {
		name           string
		server, client *pki.Leaf
	}{
		{"client cert from a rogue CA with the same name", w.server, w.rClient},
		{"server cert from a rogue CA with the same name", w.rServer, w.client},
		{"server cert through an intermediate the CA signed", interServer.WithIntermediate(inter), w.client},
		{"client cert through an intermediate the CA signed", w.server, interClient.WithIntermediate(inter)},
		{"server presents a client certificate", w.client, w.client},
		{"client presents a server certificate", w.server, w.server},
		{"expired server certificate", expired, w.client},
		{"client cert without extended key usage", w.server, noEKU},
		{"server cert for another name", otherName, w.client},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := listenTLS(t, w.serverSide(c.server))
			if err := exchange(t, l, w.clientSide(l.Addr(), c.client)); err == nil {
				t.Fatal("impostor accepted")
			}
		})
	}
}

func TestTLSRefusesClientWithoutCertificate(t *testing.T) {
	w := newTLSWorld(t)
	l := listenTLS(t, w.serverSide(w.server))
	pool := x509.NewCertPool()
	pool.AddCert(w.ca.Cert)
	if err := rawTLSExchange(t, l, &tls.Config{RootCAs: pool, ServerName: "receiver.test"}); err == nil {
		t.Fatal("client without a certificate accepted")
	}
}

// A TLS 1.2 peer, even with a good certificate, is refused.
func TestTLSRefusesTLS12(t *testing.T) {
	w := newTLSWorld(t)
	l := listenTLS(t, w.serverSide(w.server))
	pool := x509.NewCertPool()
	pool.AddCert(w.ca.Cert)
	err := rawTLSExchange(t, l, &tls.Config{RootCAs: pool, ServerName: "receiver.test",
		Certificates: []tls.Certificate{w.client.TLSCertificate()}, MaxVersion: tls.VersionTLS12})
	if err == nil {
		t.Fatal("TLS 1.2 client accepted")
	}
}

func rawTLSExchange(t *testing.T, l Listener, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	got := make(chan io.ReadWriteCloser, 1)
	go func() {
		s, _ := l.Accept(ctx)
		got <- s
	}()
	c, err := tls.Dial("tcp", l.Addr(), cfg)
	if err == nil {
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if s := <-got; s != nil {
		s.Close()
		return nil
	}
	return errors.Join(errors.New("refused"), err)
}

// A peer that opens TCP and never handshakes does not hold up others.
func TestTLSStalledHandshakeDoesNotBlock(t *testing.T) {
	w := newTLSWorld(t)
	l := listenTLS(t, w.serverSide(w.server))
	for range 3 {
		stall, err := net.Dial("tcp", l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer stall.Close()
	}
	if err := exchange(t, l, w.clientSide(l.Addr(), w.client)); err != nil {
		t.Fatalf("good client behind stalled ones: %v", err)
	}
}

func TestTLSConfigRefusals(t *testing.T) {
	w := newTLSWorld(t)
	ctx := testCtx(t)
	base := w.clientSide("127.0.0.1:1", w.client)
	cases := map[string]func(*TLS){
		"no CA":           func(c *TLS) { c.CA = nil },
		"CA not a CA":     func(c *TLS) { c.CA = w.server.Cert },
		"no own cert":     func(c *TLS) { c.Certificate = tls.Certificate{} },
		"no server name":  func(c *TLS) { c.ServerName = "" },
		"pin mismatch":    func(c *TLS) { c.CASPKISHA256 = w.rogue.SPKISHA256() },
		"no address":      func(c *TLS) { c.Address = "" },
		"pin not hex-256": func(c *TLS) { c.CASPKISHA256 = "abc" },
	}
	for name, mutate := range cases {
		c := base
		mutate(&c)
		if _, err := c.Dial(ctx); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Dial err = %v, want ErrConfig", name, err)
		}
	}
}

func TestLoadTLS(t *testing.T) {
	w := newTLSWorld(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := w.ca.WriteCert(caFile); err != nil {
		t.Fatal(err)
	}
	sc, sk, err := w.server.WriteFiles(dir, "receiver")
	if err != nil {
		t.Fatal(err)
	}
	cc, ck, _ := w.client.WriteFiles(dir, "custodian")
	st, err := LoadTLS("127.0.0.1:0", caFile, sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := LoadTLS("", caFile, cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	l := listenTLS(t, st)
	ct.Address, ct.ServerName = l.Addr(), "127.0.0.1"
	if err := exchange(t, l, ct); err != nil {
		t.Fatal(err)
	}
	// A CA file with two certificates is ambiguous: refused.
	two := filepath.Join(dir, "two.crt")
	os.WriteFile(two, append(w.ca.CertPEM(), w.rogue.CertPEM()...), 0o644)
	if _, err := LoadTLS("x", two, cc, ck); !errors.Is(err, ErrConfig) {
		t.Errorf("two CAs in the CA file: %v", err)
	}
	if _, err := LoadTLS("x", sc, cc, ck); !errors.Is(err, ErrConfig) {
		t.Errorf("leaf as CA file: %v", err)
	}
	if _, err := LoadTLS("x", caFile, cc, sk); !errors.Is(err, ErrConfig) {
		t.Errorf("key of another certificate: %v", err)
	}
}
