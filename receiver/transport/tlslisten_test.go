package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests attack the TLS listener the way a command inside the
// computer could: idle TCP connections, ClientHellos that never finish,
// garbage. Clients come from distinct loopback addresses that the
// listener is told are distinct peers (every loopback address is one peer
// in production: wire.PeerOf), so an attacker and a good client can be
// told apart on one machine.

// peerMapListener reports 127.0.0.N as the peer 10.0.0.N.
type peerMapListener struct{ net.Listener }

func (l peerMapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	a := c.RemoteAddr().(*net.TCPAddr)
	return remoteAs{Conn: c, remote: &net.TCPAddr{IP: net.IPv4(10, 0, 0, a.IP.To4()[3]), Port: a.Port}}, nil
}

type remoteAs struct {
	net.Conn
	remote net.Addr
}

func (c remoteAs) RemoteAddr() net.Addr { return c.remote }

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// attackListener listens on 127.0.0.1 with the production timeouts.
func attackListener(t *testing.T, w *tlsWorld) (*tlsListener, *logBuffer) {
	t.Helper()
	cfg, err := w.serverSide(w.server).config(true)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	buf := &logBuffer{}
	l := newTLSListener(peerMapListener{ln}, cfg, DefaultHandshakeTimeout, DefaultHelloTimeout,
		slog.New(slog.NewTextHandler(buf, nil)))
	t.Cleanup(func() { l.Close() })
	return l, buf
}

// dialFrom opens a TCP connection from the loopback address from.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// goodClient completes a mutual handshake from 127.0.0.1 and exchanges a
// byte through Accept, within bound.
func goodClient(t *testing.T, w *tlsWorld, l *tlsListener, bound time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	raw := dialFrom(t, "127.0.0.1", l.Addr())
	pool := x509.NewCertPool()
	pool.AddCert(w.ca.Cert)
	c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "receiver.test", MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{w.client.TLSCertificate()}})
	if err := c.HandshakeContext(ctx); err != nil {
		t.Fatalf("good client's handshake within %s: %v", bound, err)
	}
	s, err := l.Accept(ctx)
	if err != nil {
		t.Fatalf("good client not accepted within %s: %v", bound, err)
	}
	defer s.Close()
	go c.Write([]byte("x"))
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
}

// closedBy asserts the listener closed c (EOF or reset) before bound.
func closedBy(t *testing.T, c net.Conn, bound time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %s", bound)
	}
}

// TestAttackIdleConnectionsDoNotStarveTLS: 300 idle TCP connections from
// one peer neither delay a good client (Accept never waits on a slot) nor
// outlive the ClientHello deadline.
func TestAttackIdleConnectionsDoNotStarveTLS(t *testing.T) {
	w := newTLSWorld(t)
	l, _ := attackListener(t, w)
	idle := make([]net.Conn, 300)
	for i := range idle {
		idle[i] = dialFrom(t, "127.0.0.2", l.Addr())
	}
	goodClient(t, w, l, 5*time.Second) // before: 32 slots of 10 s each, ~90 s
	for _, c := range idle {
		closedBy(t, c, 5*time.Second) // before: 10 s, and later for the queued ones
	}
}

// stallAfterHello lets a TLS client send its first flight (the
// ClientHello) and blocks its later writes until released.
type stallAfterHello struct {
	net.Conn
	writes  int
	release chan struct{}
}

func (s *stallAfterHello) Write(p []byte) (int, error) {
	if s.writes++; s.writes > 1 {
		<-s.release
		return 0, net.ErrClosed
	}
	return s.Conn.Write(p)
}

// TestAttackStalledHandshakesCappedPerPeer: a peer that sends ClientHellos
// and then stalls holds at most maxHandshakesPerPeer handshake slots;
// its further connections are closed at once and a good client from
// another peer is not delayed.
func TestAttackStalledHandshakesCappedPerPeer(t *testing.T) {
	w := newTLSWorld(t)
	l, logs := attackListener(t, w)
	release := make(chan struct{})
	var stalled sync.WaitGroup
	defer func() { close(release); stalled.Wait() }()
	var conns []net.Conn
	for range 40 {
		raw := dialFrom(t, "127.0.0.2", l.Addr())
		conns = append(conns, raw)
		c := tls.Client(&stallAfterHello{Conn: raw, release: release}, &tls.Config{InsecureSkipVerify: true,
			Certificates: []tls.Certificate{w.client.TLSCertificate()}})
		stalled.Go(func() { _ = c.Handshake() })
	}
	goodClient(t, w, l, 5*time.Second) // before: 32 stalled slots for 10 s
	closedFast := 0
	for _, c := range conns[maxHandshakesPerPeer:] {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closedFast++
		}
	}
	if closedFast < 40-2*maxHandshakesPerPeer { // a slot freed meanwhile may take one more
		t.Fatalf("only %d of %d connections beyond the per-peer limit were closed at once\n%s", closedFast, 40-maxHandshakesPerPeer, logs)
	}
	if !strings.Contains(logs.String(), refusedPeer) {
		t.Fatalf("log does not name the per-peer limit:\n%s", logs)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestAttackGarbageFloodLogBounded: 2,000 connections that send garbage
// instead of a ClientHello add a bounded number of log lines (the first
// refusal of each reason, then one count line at the window's end).
func TestAttackGarbageFloodLogBounded(t *testing.T) {
	w := newTLSWorld(t)
	l, logs := attackListener(t, w)
	for range 2000 {
		c := dialFrom(t, "127.0.0.3", l.Addr())
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		closedBy(t, c, 10*time.Second)
		c.Close()
	}
	l.Close() // logs the counts of the open windows
	out := logs.String()
	if n := strings.Count(out, "\n"); n > 6 {
		t.Fatalf("2000 garbage connections logged %d lines (%d bytes), want at most 6:\n%.2000s", n, len(out), out)
	}
	if !strings.Contains(out, "count=") {
		t.Fatalf("no aggregated count line:\n%s", out)
	}
}
