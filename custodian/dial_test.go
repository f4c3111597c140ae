package custodian

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/receiver/transport"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a certificate for name; server or client usage.
func (ca *testCA) leaf(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// tlsServer accepts mTLS connections and echoes one byte on each. It
// returns its address and a channel that receives the TLS versions each
// ClientHello offered (room for 8; a hello beyond that is not recorded).
func tlsServer(t *testing.T, ca *testCA, serverCA *testCA, maxVersion uint16) (string, <-chan []uint16) {
	t.Helper()
	certPEM, keyPEM := serverCA.leaf(t, "receiver.test", true)
	pair, _ := tls.X509KeyPair(certPEM, keyPEM)
	clients := x509.NewCertPool()
	clients.AddCert(ca.cert)
	offered := make(chan []uint16, 8)
	hello := func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		select {
		case offered <- slices.Clone(h.SupportedVersions):
		default:
		}
		return nil, nil // the listener's own config
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert, MaxVersion: maxVersion, GetConfigForClient: hello})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err == nil {
					c.Write(b)
				}
			}()
		}
	}()
	return l.Addr().String(), offered
}

func writeCreds(t *testing.T, ca *testCA) *ReceiverConfig {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM := ca.leaf(t, "custodian", false)
	tc := &ReceiverConfig{Kind: transport.KindTLS, ServerName: "receiver.test", CertFile: filepath.Join(dir, "c.pem"),
		KeyFile: filepath.Join(dir, "k.pem"), CAFile: filepath.Join(dir, "ca.pem")}
	os.WriteFile(tc.CertFile, certPEM, 0o600)
	os.WriteFile(tc.KeyFile, keyPEM, 0o600)
	os.WriteFile(tc.CAFile, ca.pem, 0o644)
	return tc
}

// dialOnce dials addr through the custodian's receiver dialer. handshake
// is the error of the dial, the TLS handshake included; only once that
// passed, echo is the error of writing one byte and reading it back (a
// byte other than the one sent is an error too).
func dialOnce(t *testing.T, tc *ReceiverConfig, addr string) (handshake, echo error) {
	t.Helper()
	rc := *tc
	rc.Address = addr
	if _, err := ReceiverDialer(rc); err != nil {
		t.Fatalf("ReceiverDialer: %v", err)
	}
	tr, err := loadTLS(rc)
	if err != nil {
		t.Fatalf("loadTLS: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tr.Dial(ctx)
	if err != nil {
		return err, nil
	}
	defer c.Close()
	if _, err := c.Write([]byte{7}); err != nil {
		return nil, err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	if b[0] != 7 {
		return nil, fmt.Errorf("echo %d, want 7", b[0])
	}
	return nil, nil
}

// alertProtocolVersion is TLS's protocol_version alert (RFC 8446, 6.2).
const alertProtocolVersion tls.AlertError = 70

// remoteAlert returns the alert the peer sent, if err reports one.
// crypto/tls reports a peer's alert as a *net.OpError with Op "remote
// error" whose Err is its unexported uint8 alert type: the code
// tls.AlertError names.
func remoteAlert(err error) (tls.AlertError, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" {
		return 0, false
	}
	v := reflect.ValueOf(op.Err)
	if !v.IsValid() || v.Kind() != reflect.Uint8 || v.Type().PkgPath() != "crypto/tls" {
		return 0, false
	}
	return tls.AlertError(v.Uint()), true
}

// TestTLSDialPinsTheIssuer dials through the custodian's receiver dialer
// (receiver/transport's TLS with credfile-checked files). Each refusal
// must be the handshake's own: a receiver certificate from another key
// fails the dial's chain verification, and a receiver that speaks at
// most TLS 1.2 is offered TLS 1.3 alone and answers the handshake with a
// protocol_version alert. A refusal only at the echo (a clean close
// after a completed handshake) does not count.
func TestTLSDialPinsTheIssuer(t *testing.T) {
	ca := newCA(t, "tether test CA")
	tc := writeCreds(t, ca)
	addr, _ := tlsServer(t, ca, ca, 0)
	if hs, echo := dialOnce(t, tc, addr); hs != nil || echo != nil {
		t.Fatalf("pinned issuer refused: handshake %v, echo %v", hs, echo)
	}
	rogue := newCA(t, "tether test CA") // same name, another key
	addr, _ = tlsServer(t, ca, rogue, 0)
	hs, echo := dialOnce(t, tc, addr)
	var verr *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	if !errors.As(hs, &verr) || !errors.As(hs, &unknown) {
		t.Fatalf("receiver certificate from another issuer key: handshake %v, echo %v; want the handshake to fail verification (unknown authority)", hs, echo)
	}
	addr, offered := tlsServer(t, ca, ca, tls.VersionTLS12)
	hs, echo = dialOnce(t, tc, addr)
	if a, ok := remoteAlert(hs); !ok || a != alertProtocolVersion {
		t.Fatalf("TLS 1.2 receiver: handshake %v, echo %v; want the handshake refused with a protocol_version alert", hs, echo)
	}
	select {
	case v := <-offered:
		if !slices.Equal(v, []uint16{tls.VersionTLS13}) {
			t.Fatalf("the custodian offered TLS versions %x, want TLS 1.3 (0304) alone", v)
		}
	default:
		t.Fatal("the TLS 1.2 receiver recorded no ClientHello")
	}
}

func TestTLSDialIgnoresProxyEnvironment(t *testing.T) {
	ca := newCA(t, "tether test CA")
	tc := writeCreds(t, ca)
	addr, _ := tlsServer(t, ca, ca, 0)
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY"} {
		t.Setenv(v, "http://127.0.0.1:1")
	}
	if hs, echo := dialOnce(t, tc, addr); hs != nil || echo != nil {
		t.Fatalf("dial went through a proxy from the environment: handshake %v, echo %v", hs, echo)
	}
}

func TestTLSCredentialModesChecked(t *testing.T) {
	ca := newCA(t, "tether test CA")
	for _, f := range []func(*ReceiverConfig) string{
		func(tc *ReceiverConfig) string { return tc.KeyFile },
		func(tc *ReceiverConfig) string { return tc.CertFile },
	} {
		tc := writeCreds(t, ca)
		tc.Address = "127.0.0.1:1"
		os.Chmod(f(tc), 0o640)
		if _, err := ReceiverDialer(*tc); !errors.Is(err, credfile.ErrUnsafe) {
			t.Fatalf("group-readable %s accepted: %v", f(tc), err)
		}
	}
	tc := writeCreds(t, ca)
	tc.Address = "127.0.0.1:1"
	os.Chmod(tc.CAFile, 0o666)
	if _, err := ReceiverDialer(*tc); !errors.Is(err, credfile.ErrUnsafe) {
		t.Fatalf("world-writable CA file accepted: %v", err)
	}
	tc = writeCreds(t, ca)
	tc.Address = "127.0.0.1:1"
	other := newCA(t, "second")
	os.WriteFile(tc.CAFile, append(ca.pem, other.pem...), 0o644)
	if _, err := ReceiverDialer(*tc); !errors.Is(err, ErrConfig) {
		t.Fatalf("two CAs accepted: %v", err)
	}
}

func TestConfigRefusesPlaintextAndUnflaggedUnix(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key","receiver":%s}`
	bad := map[string]string{
		"plaintext tcp":        `{"kind":"tcp","address":"127.0.0.1:1"}`,
		"tls without files":    `{"kind":"tls","address":"127.0.0.1:1","server_name":"r"}`,
		"tls with host_only":   `{"kind":"tls","address":"127.0.0.1:1","server_name":"r","ca_file":"a","cert_file":"b","key_file":"c","host_only":true}`,
		"unix not host-only":   `{"kind":"unix","path":"/run/r.sock"}`,
		"vsock not host-only":  `{"kind":"vsock","cid":3,"port":7000}`,
		"unknown field":        `{"kind":"unix","path":"/run/r.sock","host_only":true,"proxy":"x"}`,
		"unix with tls fields": `{"kind":"unix","path":"/run/r.sock","host_only":true,"cert_file":"c"}`,
		"tls address and path": `{"kind":"tls","address":"127.0.0.1:1","path":"/run/r.sock","server_name":"r","ca_file":"a","cert_file":"b","key_file":"c"}`,
		"tls path socket_mode": `{"kind":"tls","path":"/run/r.sock","socket_mode":438,"server_name":"r","ca_file":"a","cert_file":"b","key_file":"c"}`,
		"tls uids, no path":    `{"kind":"tls","address":"127.0.0.1:1","peer_uids":[0],"server_name":"r","ca_file":"a","cert_file":"b","key_file":"c"}`,
	}
	for name, recv := range bad {
		if _, err := ParseConfig([]byte(sprintf(base, recv)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	c, err := ParseConfig([]byte(sprintf(base, `{"kind":"unix","path":"r.sock","host_only":true}`)), "/etc/tether")
	if err != nil || c.StateDir != "/etc/tether/state" || c.Receiver.Path != "/etc/tether/r.sock" {
		t.Fatalf("relative paths: %+v %v", c, err)
	}
	c, err = ParseConfig([]byte(sprintf(base, `{"kind":"tls","path":"run/r.sock","peer_uids":[0],"server_name":"r","ca_file":"a","cert_file":"b","key_file":"c"}`)), "/etc/tether")
	if err != nil || c.Receiver.Path != "/etc/tether/run/r.sock" {
		t.Fatalf("tls over a unix socket: %+v %v", c, err)
	}
	foreign := sprintf(base, `{"kind":"unix","path":"/r","host_only":true}`)
	foreign = replaceOnce(foreign, `"principal":"alice"`, `"principal":"mallory"`)
	if _, err := ParseConfig([]byte(foreign), "/"); !errors.Is(err, ErrConfig) {
		t.Errorf("principal other than the owner accepted: %v", err)
	}
}

// TestConfigAgentPermissionSessionMeta: agent is tether or plain,
// permission reject, allow_once or allow_always, and session_meta may not
// carry the custodian's own tether/ keys.
func TestConfigAgentPermissionSessionMeta(t *testing.T) {
	base := `{"tuple":{"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/w1"},
"lease_not_after":"2030-01-01T00:00:00Z","principal":"alice","state_dir":"state","audit_key_file":"audit.key","receiver":{"kind":"unix","path":"r.sock","host_only":true}%s}`
	c, err := ParseConfig([]byte(sprintf(base, `,"agent":"plain","permission":"allow_always","session_meta":{"claudeCode":{"options":{}}}`)), "/etc/tether")
	if err != nil || c.Agent != AgentPlain || c.Permission != PermissionAllowAlways || c.SessionMeta["claudeCode"] == nil {
		t.Fatalf("ParseConfig = %+v, %v", c, err)
	}
	for _, bad := range []string{`,"agent":"clever"`, `,"permission":"allow"`, `,"session_meta":{"tether/bind":{}}`, `,"session_meta":{"tether/op":1}`, `,"session_meta":[]`} {
		if _, err := ParseConfig([]byte(sprintf(base, bad)), "/etc/tether"); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", bad, err)
		}
	}
}
