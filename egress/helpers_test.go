package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
)

var _ api.Egress = (*egress.Proxy)(nil)

// lab lifts the test loopback; lab1 lifts 127.0.0.1 only, so 127.0.0.2
// stays refused.
var testPresets = []policy.Preset{
	{Name: "lab", AllowCIDRs: []string{"127.0.0.0/8", "::1/128"}},
	{Name: "lab1", AllowCIDRs: []string{"127.0.0.1/32"}},
}

// fakeDNS is a DNS server on loopback answering A queries from answer
// (nil: NXDOMAIN), with TTL 0, and counting queries per name.
type fakeDNS struct {
	addr    string
	mu      sync.Mutex
	answer  func(name string, n int) []string
	queries map[string]int
}

func startDNS(t testing.TB, answer func(name string, n int) []string) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDNS{addr: pc.LocalAddr().String(), answer: answer, queries: map[string]int{}}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(f.serve)}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return f
}

func (f *fakeDNS) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	f.mu.Lock()
	n := f.queries[name]
	if q.Qtype == dns.TypeA {
		f.queries[name]++
	}
	f.mu.Unlock()
	addrs := f.answer(name, n)
	if addrs == nil {
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range addrs {
		ip := netip.MustParseAddr(a)
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 0}
		switch {
		case ip.Is4() && q.Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip.AsSlice()})
		case ip.Is6() && q.Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	}
	w.WriteMsg(m)
}

func (f *fakeDNS) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queries[name]
}

// staticDNS answers each name with fixed addresses.
func staticDNS(t testing.TB, names map[string][]string) *fakeDNS {
	return startDNS(t, func(name string, _ int) []string { return names[name] })
}

// lab is one test's proxy and its refusals.
type lab struct {
	p       *egress.Proxy
	logPath string
}

func newLab(t testing.TB, cfg egress.Config) *lab {
	t.Helper()
	if cfg.Presets == nil {
		cfg.Presets = testPresets
	}
	cfg.LogPath = filepath.Join(t.TempDir(), "egress.log")
	p, err := egress.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &lab{p: p, logPath: cfg.LogPath}
}

// refusals collects one computer's refusals.
type refusals struct {
	mu  sync.Mutex
	got []policy.Refusal
	c   chan policy.Refusal
}

func (r *refusals) add(x policy.Refusal) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
	select {
	case r.c <- x:
	default:
	}
}

// next waits for the next refusal.
func (r *refusals) next(t testing.TB) policy.Refusal {
	t.Helper()
	select {
	case x := <-r.c:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal reported")
		return policy.Refusal{}
	}
}

// attach serves computer id on a new loopback listener and returns its
// address.
func (l *lab) attach(t testing.TB, id string, pol policy.Policy) (string, *refusals) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &refusals{c: make(chan policy.Refusal, 1024)}
	if err := l.p.Attach(context.Background(), id, pol, ln, r.add); err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), r
}

// upstream is an HTTP server on addr ("127.0.0.1:0") counting its hits.
type upstream struct {
	addr string
	port uint16
	hits atomic.Int64
}

func startUpstream(t testing.TB, addr string, h http.Handler) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String()}
	u.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	if h == nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+u.addr) })
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

// allowPort is a policy allowing every address on port, plus presets.
func allowPort(port uint16, presets ...string) policy.Policy {
	return policy.Policy{Allow: []policy.Rule{{CIDR: "0.0.0.0/0", Ports: []uint16{port}}, {CIDR: "::/0", Ports: []uint16{port}}},
		Presets: presets}
}

// rawHTTP sends req (a full request head) to the proxy and returns the
// status line and body.
func rawHTTP(t testing.TB, proxy, req string) (string, string) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", req, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.Status, string(body)
}

func get(host string, port uint16) string {
	return fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", hostPortStr(host, port), hostPortStr(host, port))
}

func hostPortStr(host string, port uint16) string {
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s:%d", host, port)
}

// connect opens a CONNECT tunnel and returns the connection after the
// proxy's answer, with its status line.
func connect(t testing.TB, proxy, target string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return conn, br, resp.Status
}

// socks5Connect performs a SOCKS5 CONNECT to a domain name and returns
// the reply code.
func socks5Connect(t testing.TB, proxy, host string, port uint16) (net.Conn, byte) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	msg := []byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}
	msg = append(append(msg, host...), byte(port>>8), byte(port))
	conn.Write(msg)
	reply := make([]byte, 12)
	if _, err := io.ReadFull(conn, reply); err != nil {
		t.Fatalf("SOCKS5 reply: %v", err)
	}
	conn.SetDeadline(time.Time{})
	return conn, reply[3]
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// echoServer echoes every connection on 127.0.0.1.
type echoServer struct{ port uint16 }

func startEcho(t testing.TB) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return &echoServer{port: uint16(ln.Addr().(*net.TCPAddr).Port)}
}

// startTLSUpstream is an HTTPS server on 127.0.0.1 with a self-signed
// certificate.
func startTLSUpstream(t testing.TB) *upstream {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls hello") }))
	t.Cleanup(srv.Close)
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())
	return &upstream{addr: ap.String(), port: ap.Port()}
}

// tlsThrough opens a CONNECT tunnel to target, then a TLS handshake
// naming sni (none when empty), then one GET.
func tlsThrough(t testing.TB, proxy, target, sni string) error {
	conn, br, status := connect(t, proxy, target)
	if !strings.HasPrefix(status, "200 ") {
		return fmt.Errorf("CONNECT: %s", status)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		return err
	}
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// bufConn reads through a bufio.Reader that may hold bytes already.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// readLog verifies the egress log and returns its records.
func readLog(t testing.TB, path string) []egresslog.Record {
	t.Helper()
	if _, err := egresslog.Verify(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []egresslog.Record
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r egresslog.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}
