package view

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func selfSigned(t *testing.T) *tls.Config {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"view.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: k}}}
}

// TestListenRules: loopback and unix sockets only, unless TLS is given;
// a unix socket is 0600.
func TestListenRules(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "example.com:0", ":0", "unix:relative.sock", "unix:/a/../b.sock", "nonsense"} {
		if l, _, err := Listen(addr, nil); !errors.Is(err, ErrListen) {
			if l != nil {
				l.Close()
			}
			t.Errorf("Listen(%q) without TLS: %v, want ErrListen", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0"} {
		l, origin, err := Listen(addr, nil)
		if err != nil || !strings.HasPrefix(origin, "http://") {
			t.Fatalf("Listen(%q): %q %v", addr, origin, err)
		}
		l.Close()
	}
	l, origin, err := Listen("0.0.0.0:0", selfSigned(t))
	if err != nil || !strings.HasPrefix(origin, "https://0.0.0.0:") {
		t.Fatalf("Listen with TLS: %q %v", origin, err)
	}
	l.Close()
	p := filepath.Join(t.TempDir(), "view.sock")
	l, origin, err = Listen("unix:"+p, nil)
	if err != nil || origin != "" {
		t.Fatalf("unix: %q %v", origin, err)
	}
	defer l.Close()
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("unix socket mode %v %v", st.Mode(), err)
	}
}

func TestParseOrigin(t *testing.T) {
	for in, want := range map[string]string{"http://127.0.0.1:8443": "http://127.0.0.1:8443", "https://View.Example": "https://view.example",
		"https://view.example/": "https://view.example"} {
		if got, err := ParseOrigin(in); err != nil || got != want {
			t.Errorf("ParseOrigin(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "ftp://x", "http://", "https://u:p@x", "https://x/path", "https://x?q", "https://x#f", "127.0.0.1:8443"} {
		if _, err := ParseOrigin(bad); err == nil {
			t.Errorf("ParseOrigin(%q) accepted", bad)
		}
	}
}
