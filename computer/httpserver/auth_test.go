package httpserver

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// TestTokenStoredAsHashOnly: the token file holds the SHA-256 of each
// token's secret and never the token (nor its secret in any encoding);
// the token works (positive control), an unknown, malformed or missing
// token answers 401 and is audited, and a body cannot choose the owner.
func TestTokenStoredAsHashOnly(t *testing.T) {
	h := newHarness(t)
	data, err := os.ReadFile(h.tokPath)
	if err != nil {
		t.Fatal(err)
	}
	for owner, tok := range h.tokens {
		secret := strings.TrimPrefix(tok, TokenPrefix)
		if bytes.Contains(data, []byte(tok)) || bytes.Contains(bytes.ToLower(data), []byte(secret)) {
			t.Errorf("the token file holds %s's token", owner)
		}
		raw, _ := hex.DecodeString(secret)
		sum := sha256.Sum256(raw)
		if !bytes.Contains(data, []byte(hex.EncodeToString(sum[:]))) {
			t.Errorf("the token file lacks the hash of %s's token", owner)
		}
	}
	if st, _ := os.Stat(h.tokPath); st.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
	}
	h.be.expect("List", 1)
	if a := h.do(req{method: "GET", path: "/v1/computers", owner: "alice"}); a.status != 200 {
		t.Fatalf("positive control: alice's token: %d %s", a.status, a.body)
	}
	unknown := TokenPrefix + strings.Repeat("ab", 32)
	h.tokens["mallory"] = unknown
	h.tokens["malformed"] = "tct_zz"
	h.tokens["bare"] = strings.TrimPrefix(h.tokens["alice"], TokenPrefix)
	raw, _ := hex.DecodeString(h.tokens["bare"])
	sum := sha256.Sum256(raw)
	h.tokens["hash"] = TokenPrefix + hex.EncodeToString(sum[:]) // what the file holds is no token
	for _, who := range []string{"", "mallory", "malformed", "bare", "hash"} {
		wantError(t, "token "+who, h.do(req{method: "GET", path: "/v1/computers", owner: who}), 401, api.CodeUnauthorized)
	}
	if n := len(h.audited(AuditUnauthorized)); n != 5 {
		t.Errorf("%d unauthorized audit records, want 5", n)
	}
	h.be.expect("Create", 1)
	a := h.do(req{method: "POST", path: "/v1/computers", owner: "bob", body: `{}`})
	var c api.Computer
	if err := jsonDecode(a.body, &c); err != nil || c.Owner != "bob" {
		t.Errorf("create with bob's token made %s (%v), want bob's", a.body, err)
	}
}

// TestTokenAddedWhileServing: a token added after the server started is
// admitted at its first use; a token file made group-writable admits no
// token at all (fail closed).
func TestTokenAddedWhileServing(t *testing.T) {
	h := newHarness(t)
	tok, err := AddToken(h.tokPath, "carol", false)
	if err != nil {
		t.Fatal(err)
	}
	h.tokens["carol"] = tok
	h.be.expect("List", 1)
	if a := h.do(req{method: "GET", path: "/v1/computers", owner: "carol"}); a.status != 200 {
		t.Errorf("new token: %d %s", a.status, a.body)
	}
	if err := os.Chmod(h.tokPath, 0o620); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(h.tokPath, time.Now(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	wantError(t, "group-writable token file", h.do(req{method: "GET", path: "/v1/computers", owner: "alice"}), 401, api.CodeUnauthorized)
}

// TestTokenFileRefused: a token file with an unknown field, a duplicate
// key or a malformed hash is refused.
func TestTokenFileRefused(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("a", 64)
	for name, body := range map[string]string{
		"unknown":   `{"tokens":[{"sha256":"` + good + `","owner":"a","role":"x"}]}`,
		"duplicate": `{"tokens":[{"sha256":"` + good + `","owner":"a","owner":"b"}]}`,
		"shorthash": `{"tokens":[{"sha256":"abcd","owner":"a"}]}`,
		"upperhash": `{"tokens":[{"sha256":"` + strings.Repeat("A", 64) + `","owner":"a"}]}`,
		"badowner":  `{"tokens":[{"sha256":"` + good + `","owner":"a b"}]}`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenTokens(p); !errors.Is(err, ErrTokenFile) {
			t.Errorf("%s: OpenTokens = %v, want ErrTokenFile", name, err)
		}
	}
	p := filepath.Join(dir, "ok")
	if err := os.WriteFile(p, []byte(`{"tokens":[{"sha256":"`+good+`","owner":"a"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenTokens(p); err != nil {
		t.Errorf("positive control: a valid file: %v", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenTokens(link); !errors.Is(err, ErrTokenFile) {
		t.Errorf("a symlink to a valid file: OpenTokens = %v, want ErrTokenFile", err)
	}
}

// selfSigned returns a certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tether-computer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestTLSListenerRefusesTLS12: the TCP listener completes no TLS 1.2
// handshake; positive control: a TLS 1.3 client with a token is served,
// and without a token it answers 401.
func TestTLSListenerRefusesTLS12(t *testing.T) {
	h := newHarness(t)
	cert, pool := selfSigned(t)
	l, err := ListenTLS("127.0.0.1:0", cert)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	addr := l.Addr().String()
	c12, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12})
	if err == nil {
		c12.Close()
		t.Fatal("a TLS 1.2 client completed a handshake")
	}
	c13, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatalf("positive control: TLS 1.3 handshake: %v", err)
	}
	if v := c13.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("negotiated %x, want TLS 1.3", v)
	}
	c13.Close()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: checkedTransport{t: t, next: tr}}
	for owner, status := range map[string]int{"alice": 200, "": 401} {
		if owner != "" {
			h.be.expect("List", 1)
		}
		r, _ := http.NewRequest("GET", "https://"+addr+"/v1/computers", nil)
		if owner != "" {
			r.Header.Set("Authorization", "Bearer "+h.tokens[owner])
		}
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("over TLS 1.3 as %q: %d, want %d", owner, resp.StatusCode, status)
		}
	}
}

// TestTLSConfigIsTLS13Only pins the configuration itself.
func TestTLSConfigIsTLS13Only(t *testing.T) {
	cert, _ := selfSigned(t)
	if c := TLSConfig(cert); c.MinVersion != tls.VersionTLS13 {
		t.Fatalf("MinVersion %x", c.MinVersion)
	}
}
