package wireserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// peerConn is a real socket whose remote address claims a TCP source, so
// PeerOf names it ip:ADDR.
type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.remote }

func tcpFrom(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// limitRig serves statHandler on a listener fed by hand.
type limitRig struct {
	t   *testing.T
	l   *pairListener
	srv *Server
	log *lockedBuffer
}

func newLimitRig(t *testing.T, cfg ServerConfig) *limitRig {
	r := &limitRig{t: t, l: &pairListener{conns: make(chan net.Conn), closed: make(chan struct{})}, log: &lockedBuffer{}}
	cfg.Log = slog.New(slog.NewTextHandler(r.log, nil))
	r.srv, _ = NewServer(statHandler, cfg)
	served := make(chan error, 1)
	go func() { served <- r.srv.Serve(context.Background(), r.l) }()
	t.Cleanup(func() { r.srv.Close(); <-served })
	return r
}

// connect hands the server a connection from ip and returns the client
// end (the raw socket) once the server took it.
func (r *limitRig) connect(ip string) net.Conn {
	cc, sc := socktest.Pair(r.t)
	select {
	case r.l.conns <- peerConn{Conn: sc, remote: tcpFrom(ip)}:
	case <-time.After(10 * time.Second): // a bound: Accept must never block on a slot
		r.t.Fatal("the server did not accept within 10 s")
	}
	return cc
}

// served reports whether a request on c is answered.
func served(t *testing.T, c net.Conn) bool {
	t.Helper()
	cl, err := wireclient.NewClient(c, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var res wire.StatResult
	err = cl.Call(testCtx(t), wire.OpStat, testDigest, testOpKey, soon(), &wire.StatArgs{Path: "abc"}, &res)
	return err == nil && res.Size == 3
}

// closedAtOnce asserts the server closed c without a word.
func closedAtOnce(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("over-limit connection: read %d bytes, err %v; want it closed at once (EOF)", n, err)
	}
}

// TestAttackConnectionsCappedPerPeer: one peer holding its quota of idle
// connections gets every further one closed at once, while another peer
// is still served; a connection that ends frees its slot; and a flood of
// refused connections adds a bounded number of log lines.
func TestAttackConnectionsCappedPerPeer(t *testing.T) {
	r := newLimitRig(t, ServerConfig{MaxConns: 8, MaxConnsPerPeer: 2})
	var held []net.Conn
	for range 2 {
		held = append(held, r.connect("10.0.2.15")) // idle: never sends a byte
	}
	for range 500 {
		closedAtOnce(t, r.connect("10.0.2.15"))
	}
	if !served(t, r.connect("10.0.2.2")) {
		t.Fatal("another peer was not served while the first held its quota")
	}
	held[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := r.connect("10.0.2.15")
		if served(t, c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection never freed its peer's slot")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := strings.Count(r.log.String(), "\n"); n > 2 {
		t.Fatalf("500 refused connections logged %d lines, want at most 2:\n%s", n, r.log)
	}
}

// TestAttackConnectionsCappedInTotal: past MaxConns every new connection,
// from any peer, is closed at once; the loopback addresses are one peer.
func TestAttackConnectionsCappedInTotal(t *testing.T) {
	r := newLimitRig(t, ServerConfig{MaxConns: 3, MaxConnsPerPeer: 2})
	r.connect("127.0.0.1")
	r.connect("127.0.0.2")
	closedAtOnce(t, r.connect("127.0.0.3")) // loopback: one peer, quota 2
	r.connect("10.0.0.1")
	closedAtOnce(t, r.connect("10.0.0.2"))
	if !strings.Contains(r.log.String(), "connection limit (3)") {
		t.Fatalf("log does not name the total limit:\n%s", r.log)
	}
}
