package egress_test

// Attacks an outside reviewer tried against the proxy beyond those of
// attacks_test.go: request smuggling and pipelining, host spellings
// against deny rules, fragmented and dripped ClientHellos, SOCKS5 corner
// cases, limits on uploads, policy changes during a plain HTTP answer,
// and what a request can do to the log and the refusal texts. Each has a
// positive control, or says why none exists.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
)

// pathUpstream is an upstream that records the path of every request.
type pathUpstream struct {
	*upstream
	mu    sync.Mutex
	paths []string
}

func startPathUpstream(t *testing.T) *pathUpstream {
	t.Helper()
	p := &pathUpstream{}
	p.upstream = startUpstream(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.paths = append(p.paths, r.Method+" "+r.URL.Path+" host="+r.Host)
		p.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	return p
}

func (p *pathUpstream) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paths...)
}

// sendAll writes raw to addr, then reads until the peer closes (or 5 s).
func sendAll(t *testing.T, addr, raw string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, raw)
	b, _ := io.ReadAll(conn)
	return string(b)
}

// TestRedteamPipelinedRequestsNotForwarded: a second request written
// behind an allowed first one, on the same connection (pipelining, or
// keep-alive after the answer), is never sent anywhere: not to the first
// request's destination (no reused upstream connection), not to its own.
// Positive control: the same bytes sent straight to the upstream make it
// serve both, so a proxy that passed the client's bytes through would
// have delivered the second.
func TestRedteamPipelinedRequestsNotForwarded(t *testing.T) {
	a, b := startPathUpstream(t), startPathUpstream(t)
	l := newLab(t, egress.Config{})
	pol := policy.Policy{Allow: []policy.Rule{{CIDR: "127.0.0.1/32", Ports: []uint16{a.port, b.port}}}, Presets: []string{"lab"}}
	on, _ := l.attach(t, "on", pol)
	ha, hb := hostPortStr("127.0.0.1", a.port), hostPortStr("127.0.0.1", b.port)
	two := fmt.Sprintf("GET http://%s/first HTTP/1.1\r\nHost: %s\r\n\r\n", ha, ha) +
		fmt.Sprintf("GET http://%s/second HTTP/1.1\r\nHost: %s\r\n\r\n", hb, hb) +
		fmt.Sprintf("GET http://%s/third HTTP/1.1\r\nHost: %s\r\n\r\n", ha, ha)
	got := sendAll(t, on, two)
	if strings.Count(got, "HTTP/1.1 ") != 1 {
		t.Errorf("pipelined: %d answers, want 1: %q", strings.Count(got, "HTTP/1.1 "), got)
	}
	if sa, sb := a.seen(), b.seen(); len(sa) != 1 || sa[0] != "GET /first host="+ha || len(sb) != 0 {
		t.Errorf("pipelined: a saw %q, b saw %q; want only the first request", sa, sb)
	}

	// Keep-alive: the answer read, the policy changed to deny, a second
	// request on the same connection.
	conn, err := net.Dial("tcp", on)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	fmt.Fprintf(conn, "GET http://%s/keep HTTP/1.1\r\nHost: %s\r\n\r\n", ha, ha)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("keep-alive first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if err := l.p.SetPolicy(context.Background(), "on", policy.Policy{}); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET http://%s/after-change HTTP/1.1\r\nHost: %s\r\n\r\n", ha, ha)
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("keep-alive second request answered: %q", rest)
	}
	if sa := a.seen(); len(sa) != 2 {
		t.Errorf("keep-alive: a saw %q, want /first and /keep only", sa)
	}

	sendAll(t, a.addr, fmt.Sprintf("GET /direct1 HTTP/1.1\r\nHost: %s\r\n\r\nGET /direct2 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", ha, ha))
	if sa := a.seen(); len(sa) != 4 {
		t.Errorf("positive control: straight to the upstream, a saw %q; want both pipelined requests", sa)
	}
}

// TestRedteamSmugglingReserialized: Content-Length with
// Transfer-Encoding, two Content-Lengths, an obs-folded Host header and a
// Host header with a space before its colon cannot smuggle a second
// request or another Host to the destination: net/http parses the
// request and writes it again, so the destination sees one request with
// the URL's host. Positive control: the CL.TE bytes sent straight to the
// upstream make it serve the smuggled request.
func TestRedteamSmugglingReserialized(t *testing.T) {
	a := startPathUpstream(t)
	l := newLab(t, egress.Config{})
	on, _ := l.attach(t, "on", allowPort(a.port, "lab"))
	ha := hostPortStr("127.0.0.1", a.port)
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	clte := fmt.Sprintf("Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n0\r\n\r\n%s", 5+len(smuggled), smuggled)
	cases := []struct{ hdr, want string }{
		{clte, "200 "},
		{"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "400 "},
		{"Host: " + ha + "\r\n evil.test\r\n\r\n", "403 "},
		{"Host : evil.test\r\n\r\n", "200 "},
		{"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", "400 "},
	}
	for _, c := range cases {
		got := sendAll(t, on, fmt.Sprintf("POST http://%s/ HTTP/1.1\r\nHost: %s\r\n%s", ha, ha, c.hdr))
		if !strings.HasPrefix(got, "HTTP/1.1 "+c.want) {
			t.Errorf("%q: answer %.80q, want %s", c.hdr, got, c.want)
		}
	}
	for _, p := range a.seen() {
		if p != "POST / host="+ha {
			t.Errorf("through the proxy the upstream saw %q", p)
		}
	}
	if n := len(a.seen()); n != 2 {
		t.Errorf("through the proxy the upstream saw %d requests, want 2", n)
	}
	sendAll(t, a.addr, fmt.Sprintf("POST / HTTP/1.1\r\nHost: %s\r\n%s", ha, clte))
	if seen := a.seen(); !strings.Contains(strings.Join(seen, ","), "/smuggled host=evil.test") {
		t.Errorf("positive control: straight to the upstream it saw %q, want the smuggled request too", seen)
	}
}

// TestRedteamConnectPipelineStaysInTheTunnel: bytes sent behind the
// CONNECT head in the same write go to the CONNECT's destination, never
// read as a second proxy request: without allow_no_sni they are refused
// (not TLS), with it the echo server gets them. Positive control: the
// same GET as a request of its own reaches the other upstream.
func TestRedteamConnectPipelineStaysInTheTunnel(t *testing.T) {
	echo := startEcho(t)
	b := startPathUpstream(t)
	l := newLab(t, egress.Config{})
	pol := policy.Policy{Allow: []policy.Rule{{CIDR: "127.0.0.1/32", Ports: []uint16{echo.port, b.port}}}, Presets: []string{"lab"}}
	strict, ref := l.attach(t, "strict", pol)
	pol.AllowNoSNI = true
	loose, _ := l.attach(t, "loose", pol)
	he, hb := hostPortStr("127.0.0.1", echo.port), hostPortStr("127.0.0.1", b.port)
	get := fmt.Sprintf("GET http://%s/pipelined HTTP/1.1\r\nHost: %s\r\n\r\n", hb, hb)
	raw := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n%s", he, he, get)

	got := sendAll(t, strict, raw)
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") || strings.Contains(got, "pipelined") {
		t.Errorf("strict: %q", got)
	}
	if r := ref.next(t); r.Check != policy.CheckSNI {
		t.Errorf("strict: refusal %+v, want sni", r)
	}
	conn, err := net.Dial("tcp", loose)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, raw)
	want := "HTTP/1.1 200 Connection established\r\n\r\n" + get
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != want {
		t.Errorf("loose: %q, %v; want the GET echoed by the CONNECT's destination", buf, err)
	}
	if seen := b.seen(); len(seen) != 0 {
		t.Errorf("the pipelined GET reached its own host: %q", seen)
	}
	if status, _ := rawHTTP(t, loose, get); !strings.HasPrefix(status, "200 ") || len(b.seen()) != 1 {
		t.Errorf("positive control: the GET on its own: %s, %q", status, b.seen())
	}
}

// TestRedteamDenyNotBypassedBySpelling: a deny rule under an allowing
// wildcard holds against upper case and a trailing dot, by HTTP forward,
// CONNECT and SOCKS5, and the denied name is not even resolved. A name
// with a NUL byte or another character outside a DNS name is refused as
// malformed. Positive control: the same spellings of an allowed sibling
// go through on each path.
func TestRedteamDenyNotBypassedBySpelling(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	d := staticDNS(t, map[string][]string{"secret.allowed.test": {"127.0.0.1"}, "ok.allowed.test": {"127.0.0.1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	pol := policy.Policy{Allow: []policy.Rule{{Host: "*.allowed.test", Ports: []uint16{up.port}}},
		Deny: []policy.Rule{{Host: "secret.allowed.test", Ports: []uint16{up.port}}}, Presets: []string{"lab"}, AllowNoSNI: true}
	on, ref := l.attach(t, "on", pol)
	for spell, ok := range map[string]string{"SECRET.allowed.test": "OK.allowed.test", "Secret.Allowed.Test.": "Ok.Allowed.Test.",
		"secret.allowed.test.": "ok.allowed.test."} {
		if status, _ := rawHTTP(t, on, get(spell, up.port)); !strings.HasPrefix(status, "403 ") {
			t.Errorf("GET %s: %s", spell, status)
		}
		if _, _, status := connect(t, on, hostPortStr(spell, up.port)); !strings.HasPrefix(status, "403 ") {
			t.Errorf("CONNECT %s: %s", spell, status)
		}
		if _, code := socks5Connect(t, on, spell, up.port); code != 2 {
			t.Errorf("SOCKS5 %s: reply %d", spell, code)
		}
		for range 3 {
			if r := ref.next(t); r.Check != policy.CheckPolicy {
				t.Errorf("%s: refusal %+v", spell, r)
			}
		}
		if status, _ := rawHTTP(t, on, get(ok, up.port)); !strings.HasPrefix(status, "200 ") {
			t.Errorf("positive control: GET %s: %s", ok, status)
		}
		if _, _, status := connect(t, on, hostPortStr(ok, up.port)); !strings.HasPrefix(status, "200 ") {
			t.Errorf("positive control: CONNECT %s: %s", ok, status)
		}
		if _, code := socks5Connect(t, on, ok, up.port); code != 0 {
			t.Errorf("positive control: SOCKS5 %s: reply %d", ok, code)
		}
	}
	if n := d.count("secret.allowed.test"); n != 0 {
		t.Errorf("the denied name was resolved %d times", n)
	}
	for _, bad := range []string{"ok.allowed.test\x00.evil.test", "ok.allowed.test\n", "ok.allowed.test%2e", "ok。allowed.test", ""} {
		if _, code := socks5Connect(t, on, bad, up.port); code == 0 {
			t.Errorf("SOCKS5 %q: reply 0", bad)
		}
	}
}

// clientHello returns the bytes crypto/tls's client sends first for
// cfg: its ClientHello, in records.
func clientHello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	cli, srv := net.Pipe()
	defer srv.Close()
	go func() { tls.Client(cli, cfg).Handshake(); cli.Close() }()
	srv.SetDeadline(time.Now().Add(5 * time.Second))
	var out, msg []byte
	for len(msg) < 4 || len(msg) < 4+int(msg[1])<<16|int(msg[2])<<8|int(msg[3]) {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(srv, hdr); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
		if _, err := io.ReadFull(srv, body); err != nil {
			t.Fatal(err)
		}
		out = append(append(out, hdr...), body...)
		msg = append(msg, body...)
	}
	return out
}

// refragment sends hello's handshake bytes again in records of at most
// n bytes each.
func refragment(hello []byte, n int) []byte {
	var msg, out []byte
	for len(hello) > 0 {
		l := int(binary.BigEndian.Uint16(hello[3:]))
		msg = append(msg, hello[5:5+l]...)
		hello = hello[5+l:]
	}
	for len(msg) > 0 {
		k := min(n, len(msg))
		out = append(out, 0x16, 3, 1, byte(k>>8), byte(k))
		out, msg = append(out, msg[:k]...), msg[k:]
	}
	return out
}

// TestRedteamFragmentedClientHello: a ClientHello cut into one-byte
// records still shows its server name to the proxy, so a wrong one is
// refused, with or without allow_no_sni. Positive control: the same
// framing naming the CONNECT host reaches the echo server byte for byte.
func TestRedteamFragmentedClientHello(t *testing.T) {
	echo := startEcho(t)
	d := staticDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	pol := policy.Policy{Allow: []policy.Rule{{Host: "allowed.test", Ports: []uint16{echo.port}}}, Presets: []string{"lab"}}
	strict, ref := l.attach(t, "strict", pol)
	pol.AllowNoSNI = true
	loose, looseRef := l.attach(t, "loose", pol)
	target := hostPortStr("allowed.test", echo.port)
	evil := refragment(clientHello(t, &tls.Config{ServerName: "evil.test"}), 1)
	for name, proxy := range map[string]string{"strict": strict, "loose": loose} {
		conn, br, status := connect(t, proxy, target)
		if !strings.HasPrefix(status, "200 ") {
			t.Fatalf("%s: CONNECT: %s", name, status)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(evil)
		if b, _ := io.ReadAll(br); len(b) != 0 {
			t.Errorf("%s: the fragmented hello naming evil.test was echoed (%d bytes)", name, len(b))
		}
	}
	for _, r := range []policy.Refusal{ref.next(t), looseRef.next(t)} {
		if r.Check != policy.CheckSNI || !strings.Contains(r.Reason, "evil.test") {
			t.Errorf("refusal %+v", r)
		}
	}
	good := refragment(clientHello(t, &tls.Config{ServerName: "allowed.test"}), 1)
	conn, br, _ := connect(t, strict, target)
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	conn.Write(good)
	back := make([]byte, len(good))
	if _, err := io.ReadFull(br, back); err != nil || !bytes.Equal(back, good) {
		t.Errorf("positive control: %d of %d bytes echoed, %v", len(back), len(good), err)
	}
}

// TestRedteamClientHelloDrip: a ClientHello dripped a few bytes at a
// time is cut at HeaderTimeout, measured from the 200, not from each
// byte; nothing reaches the destination. Positive control: the same drip
// under a long HeaderTimeout opens the tunnel.
func TestRedteamClientHelloDrip(t *testing.T) {
	echo := startEcho(t)
	d := staticDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	hello := clientHello(t, &tls.Config{ServerName: "allowed.test"})
	target := hostPortStr("allowed.test", echo.port)
	drip := func(proxy string) (time.Duration, int) {
		conn, br, status := connect(t, proxy, target)
		if !strings.HasPrefix(status, "200 ") {
			t.Fatalf("CONNECT: %s", status)
		}
		start := time.Now()
		go func() {
			for i := 0; i < len(hello); i += 8 {
				if _, err := conn.Write(hello[i:min(i+8, len(hello))]); err != nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, _ := io.ReadFull(br, make([]byte, len(hello)))
		return time.Since(start), n
	}
	pol := policy.Policy{Allow: []policy.Rule{{Host: "allowed.test", Ports: []uint16{echo.port}}}, Presets: []string{"lab"}}
	short := newLab(t, egress.Config{DNS: d.addr, HeaderTimeout: 200 * time.Millisecond})
	on, ref := short.attach(t, "on", pol)
	took, n := drip(on)
	if n != 0 || took > 3*time.Second {
		t.Errorf("a %d-byte hello dripped 8 bytes per 5 ms: %d bytes echoed, cut after %v (HeaderTimeout 200ms)", len(hello), n, took)
	}
	if r := ref.next(t); r.Check != policy.CheckSNI {
		t.Errorf("refusal %+v", r)
	}
	long := newLab(t, egress.Config{DNS: d.addr, HeaderTimeout: 30 * time.Second})
	off, _ := long.attach(t, "off", pol)
	if took, n := drip(off); n != len(hello) {
		t.Errorf("positive control: %d of %d bytes echoed after %v", n, len(hello), took)
	}
}

// TestRedteamBigClientHelloUnderSlowRate: a ClientHello longer than the
// rate limiter's burst (ALPN lists of 40 KB) is replayed in pieces, not
// dropped: before the fix its replay asked the limiter for more than its
// burst at once, which fails, and the tunnel closed unexplained. The
// positive control is the same hello under no rate limit.
func TestRedteamBigClientHelloUnderSlowRate(t *testing.T) {
	echo := startEcho(t)
	d := staticDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	protos := make([]string, 160)
	for i := range protos {
		protos[i] = fmt.Sprintf("%03d", i) + strings.Repeat("p", 247)
	}
	hello := clientHello(t, &tls.Config{ServerName: "allowed.test", NextProtos: protos})
	if len(hello) <= 32<<10 {
		t.Fatalf("hello of %d bytes, want more than the 32 KiB burst", len(hello))
	}
	pol := policy.Policy{Allow: []policy.Rule{{Host: "allowed.test", Ports: []uint16{echo.port}}}, Presets: []string{"lab"}}
	for name, bps := range map[string]int64{"slow": 128 << 10, "unlimited": -1} {
		l := newLab(t, egress.Config{DNS: d.addr, Limits: egress.Limits{BytesPerSecond: bps}})
		proxy, _ := l.attach(t, name, pol)
		conn, br, _ := connect(t, proxy, hostPortStr("allowed.test", echo.port))
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(hello)
		back := make([]byte, len(hello))
		if n, err := io.ReadFull(br, back); err != nil || !bytes.Equal(back, hello) {
			t.Errorf("%s: %d of %d bytes of the hello came back: %v", name, n, len(hello), err)
		}
	}
}

// TestRedteamSOCKS5Corners: BIND and UDP ASSOCIATE are answered 7
// (command not supported), a client offering only username/password
// gets 0xff (no acceptable method), an empty name is refused (1), and an
// address literal or a 255-byte name sent as a domain, and the metadata,
// loopback and IPv4-mapped addresses as IPv4 or IPv6 address types, are
// checked like any host (2); none reaches the upstream. Positive control: a CONNECT
// to the allowed name replies 0 and carries bytes.
func TestRedteamSOCKS5Corners(t *testing.T) {
	echo := startEcho(t)
	d := staticDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	on, _ := l.attach(t, "on", policy.Policy{Allow: []policy.Rule{{Host: "allowed.test", Ports: []uint16{echo.port}}},
		Presets: []string{"lab1"}, AllowNoSNI: true})
	exchange := func(msg []byte, n int) []byte {
		conn, err := net.Dial("tcp", on)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(msg)
		b := make([]byte, n)
		k, _ := io.ReadFull(conn, b)
		return b[:k]
	}
	port := []byte{byte(echo.port >> 8), byte(echo.port)}
	domain := func(cmd byte, name string) []byte {
		return append(append([]byte{5, 1, 0, 5, cmd, 0, 3, byte(len(name))}, name...), port...)
	}
	for cmd, name := range map[byte]string{2: "BIND", 3: "UDP ASSOCIATE"} {
		if r := exchange(domain(cmd, "allowed.test"), 12); len(r) < 4 || r[3] != 7 {
			t.Errorf("%s: reply %v, want 7", name, r)
		}
	}
	if r := exchange([]byte{5, 1, 2}, 2); !bytes.Equal(r, []byte{5, 0xff}) {
		t.Errorf("username/password only: %v, want [5 255]", r)
	}
	if r := exchange(domain(1, ""), 12); len(r) < 4 || r[3] != 1 {
		t.Errorf("an empty name: %v, want reply 1", r)
	}
	for _, name := range []string{"127.0.0.2", "[::1]", strings.Repeat("a.", 127) + "a"} {
		if r := exchange(domain(1, name), 12); len(r) < 4 || r[3] != 2 {
			t.Errorf("%.20q as a domain: %v, want reply 2", name, r)
		}
	}
	for _, addr := range [][]byte{{1, 169, 254, 169, 254}, {1, 127, 0, 0, 2},
		append([]byte{4}, net.ParseIP("::ffff:127.0.0.2").To16()...), append([]byte{4}, net.ParseIP("::1").To16()...)} {
		msg := append(append([]byte{5, 1, 0, 5, 1, 0}, addr...), port...)
		if r := exchange(msg, 12); len(r) < 4 || r[3] != 2 {
			t.Errorf("address type %d %v: reply %v, want 2", addr[0], addr[1:], r)
		}
	}
	conn, code := socks5Connect(t, on, "allowed.test", echo.port)
	if code != 0 {
		t.Fatalf("positive control: reply %d", code)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "ping")
	if b := make([]byte, 4); func() bool { _, err := io.ReadFull(conn, b); return err != nil || string(b) != "ping" }() {
		t.Error("positive control: no echo through the SOCKS5 tunnel")
	}
}

// TestRedteamTotalBytesUpload: the total bounds what a computer sends
// too: a 4 MiB upload by HTTP forward and through a SOCKS5 tunnel under
// a 1 MiB total is cut, and the upstream gets less than the total.
// Positive control: without the limit the same uploads arrive whole.
func TestRedteamTotalBytesUpload(t *testing.T) {
	const size = 4 << 20
	var got sync.Map // path: bytes received
	up := startUpstream(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Store(r.URL.Path, n)
	}))
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sunk := make(chan int64, 4)
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { n, _ := io.Copy(io.Discard, c); c.Close(); sunk <- n }()
		}
	}()
	sinkPort := uint16(sink.Addr().(*net.TCPAddr).Port)
	pol := policy.Policy{Allow: []policy.Rule{{CIDR: "127.0.0.1/32", Ports: []uint16{up.port, sinkPort}}},
		Presets: []string{"lab1"}, AllowNoSNI: true}
	for _, c := range []struct {
		name  string
		total int64
		whole bool
	}{{"limited", 1 << 20, false}, {"unlimited", -1, true}} {
		l := newLab(t, egress.Config{Limits: egress.Limits{TotalBytes: c.total, BytesPerSecond: -1}})
		proxy, _ := l.attach(t, c.name, pol)
		conn, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		hp := hostPortStr("127.0.0.1", up.port)
		fmt.Fprintf(conn, "POST http://%s/%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", hp, c.name, hp, size)
		conn.Write(make([]byte, size))
		io.Copy(io.Discard, conn)
		conn.Close()
		if c.whole {
			waitFor(t, "the whole upload", 10*time.Second, func() bool { _, ok := got.Load("/" + c.name); return ok })
		}
		n, _ := got.Load("/" + c.name)
		if gotN, _ := n.(int64); (gotN == size) != c.whole || !c.whole && gotN > c.total {
			t.Errorf("%s: HTTP upload of %d bytes: the upstream read %d", c.name, size, gotN)
		}

		s, code := socks5Connect(t, proxy, "127.0.0.1", sinkPort)
		if code != 0 {
			if c.whole {
				t.Fatalf("%s: SOCKS5 reply %d", c.name, code)
			}
			continue // the total is spent: refused at once, which also holds
		}
		s.SetDeadline(time.Now().Add(20 * time.Second))
		s.Write(make([]byte, size))
		s.Close()
		select {
		case n := <-sunk:
			if (n == size) != c.whole || !c.whole && n > c.total {
				t.Errorf("%s: SOCKS5 upload of %d bytes: the sink read %d", c.name, size, n)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: the sink never saw the SOCKS5 connection end", c.name)
		}
	}
}

// TestRedteamPolicyChangeClosesHTTPAnswer: a plain HTTP answer still
// streaming when the policy stops allowing its destination is cut within
// 1 s, like a tunnel. Positive control: a change that still allows it
// leaves the answer streaming.
func TestRedteamPolicyChangeClosesHTTPAnswer(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 400; i++ {
			if _, err := io.WriteString(w, "chunk\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(25 * time.Millisecond):
			}
		}
	}))
	l := newLab(t, egress.Config{})
	for _, c := range []struct {
		name  string
		after policy.Policy
		cut   bool
	}{{"denied", policy.Policy{}, true}, {"still-allowed", allowPort(up.port, "lab"), false}} {
		proxy, _ := l.attach(t, c.name, allowPort(up.port, "lab"))
		conn, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, get("127.0.0.1", up.port))
		br := bufio.NewReader(conn)
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := br.ReadString('k'); err != nil {
			t.Fatalf("%s: the answer did not start: %v", c.name, err)
		}
		if err := l.p.SetPolicy(context.Background(), c.name, c.after); err != nil {
			t.Fatal(err)
		}
		changed := time.Now()
		conn.SetDeadline(changed.Add(1500 * time.Millisecond))
		_, err = io.Copy(io.Discard, br)
		ended := time.Since(changed)
		if c.cut && (err != nil || ended > time.Second) {
			t.Errorf("%s: the answer went on for %v after the change (%v)", c.name, ended, err)
		}
		if !c.cut && err == nil {
			t.Errorf("%s: positive control: the answer ended %v after a change that allows it", c.name, ended)
		}
	}
}

// TestRedteamRequestsCannotBreakTheLog: a CONNECT target, an absolute
// URL and a request line of 20 KB, and SOCKS5 names with a newline, a
// NUL, a quote and bytes that are not UTF-8, each become one record of a
// log that still verifies, with the host clipped; the texts the computer
// sees (403 status line, refusal) stay bounded too. Before the fix the
// first such record was longer than egresslog.MaxLine, the log stopped
// verifying and the proxy could not start again on it. The positive
// control is egresslog.TestAppendRefusesOverlongRecord: the same record
// unclipped breaks Verify.
func TestRedteamRequestsCannotBreakTheLog(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	on, ref := l.attach(t, "on", allowPort(up.port, "lab"))
	long := strings.Repeat("a", 20000)
	for _, req := range []string{"CONNECT " + long + ":443 HTTP/1.1\r\n\r\n", "GET http://" + long + "/ HTTP/1.1\r\n\r\n",
		"GET http://x/" + strings.Repeat("\x01", 20000) + " HTTP/1.1\r\n\r\n"} {
		status, _ := rawHTTP(t, on, req)
		if !strings.HasPrefix(status, "4") || len(status) > 400 {
			t.Errorf("%.30q: status line of %d bytes: %.60q", req, len(status), status)
		}
		if r := ref.next(t); len(r.Host) > 400 || len(r.Reason) > 1100 {
			t.Errorf("%.30q: refusal with a host of %d and a reason of %d bytes", req, len(r.Host), len(r.Reason))
		}
	}
	forged := []string{"x\n{\"seq\":99}", "x\x00y", "\"}\n{", "\xff\xfe", "\u2028"}
	for _, h := range forged {
		conn, code := socks5Connect(t, on, h, up.port)
		conn.Close()
		if code != 2 {
			t.Errorf("SOCKS5 %q: reply %d", h, code)
		}
	}
	want := uint64(3 + len(forged))
	waitFor(t, "every record", 5*time.Second, func() bool {
		h, err := egresslog.Verify(l.logPath)
		if err != nil {
			t.Fatal(err)
		}
		return h.Records == want
	})
	recs := readLog(t, l.logPath)
	if uint64(len(recs)) != want {
		t.Fatalf("%d records, want %d", len(recs), want)
	}
	for _, r := range recs {
		if r.Verdict != egresslog.Refused || len(r.Host) > 400 {
			t.Errorf("record %d: %s, host of %d bytes", r.Seq, r.Verdict, len(r.Host))
		}
	}
}

// TestRedteamNoOracleOfInternalNames: a name the policy may allow (a CIDR
// rule resolves every name) that resolves to an internal address is
// refused without the address in the 403 or the refusal's reason, also
// when the address hides in a NAT64 form; the callback's Refusal.Addr
// (host side) and the egress log keep it. Before the fix the reason
// named it ("resolves to 10.9.8.7"), so a computer could map the host's
// internal DNS. The positive control: the address is what the proxy saw
// (the log has it).
func TestRedteamNoOracleOfInternalNames(t *testing.T) {
	d := staticDNS(t, map[string][]string{"db.internal.test": {"10.9.8.7"}, "db6.internal.test": {"64:ff9b::a09:807"},
		"both.internal.test": {"93.184.216.34", "10.9.8.7"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	on, ref := l.attach(t, "on", allowPort(80))
	for name, addr := range map[string]string{"db.internal.test": "10.9.8.7", "db6.internal.test": "64:ff9b::a09:807",
		"both.internal.test": "10.9.8.7"} {
		status, body := rawHTTP(t, on, get(name, 80))
		if !strings.HasPrefix(status, "403 ") || strings.Contains(status+body, "10.9.8.7") || strings.Contains(body, "a09:807") {
			t.Errorf("%s: %s %q", name, status, body)
		}
		r := ref.next(t)
		if r.Check != policy.CheckSpecialAddress || strings.Contains(r.Reason, "10.9.8.7") || r.Addr != addr {
			t.Errorf("%s: refusal %+v", name, r)
		}
	}
	waitFor(t, "the records", 5*time.Second, func() bool { h, _ := egresslog.Verify(l.logPath); return h.Records == 3 })
	addrs := map[string]bool{}
	for _, r := range readLog(t, l.logPath) {
		addrs[r.Addr] = true
	}
	if !addrs["10.9.8.7"] || !addrs["64:ff9b::a09:807"] {
		t.Errorf("positive control: the log's addresses %v lack the internal ones", addrs)
	}
}

// TestRedteamURLTricks: user info (also `evil#@allowed` and `allowed@evil`),
// an https:// URL in plain HTTP, a port with a trailing dot or past
// 65535, an IPv6 zone, a CONNECT with a path, without a port or to a
// port the policy lacks, and a Host header whose port differs from the
// URL's (also by leaving it out) are each refused, and none reaches the
// upstream. Positive control: the same
// upstream by its plain URL, and with the port written `0PORT`, answers.
func TestRedteamURLTricks(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	on, _ := l.attach(t, "on", allowPort(up.port, "lab"))
	hp := hostPortStr("127.0.0.1", up.port)
	for _, req := range []string{
		"GET http://user@" + hp + "/ HTTP/1.1\r\n\r\n",
		"GET http://" + hp + "@evil.test/ HTTP/1.1\r\n\r\n",
		"GET http://evil.test#@" + hp + "/ HTTP/1.1\r\n\r\n",
		"GET https://" + hp + "/ HTTP/1.1\r\n\r\n",
		"GET http://" + hp + "./ HTTP/1.1\r\n\r\n",
		"GET http://127.0.0.1:99999/ HTTP/1.1\r\n\r\n",
		fmt.Sprintf("GET http://[fe80::1%%25lo]:%d/ HTTP/1.1\r\n\r\n", up.port),
		"CONNECT " + hp + ". HTTP/1.1\r\n\r\n",
		"CONNECT " + hp + "/path HTTP/1.1\r\n\r\n",
		"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
		"CONNECT  " + hp + " HTTP/1.1\r\n\r\n",
		fmt.Sprintf("CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", up.port+1),
		fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", hp, up.port+1),
		"GET http://" + hp + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
	} {
		if status, _ := rawHTTP(t, on, req); !strings.HasPrefix(status, "403 ") && !strings.HasPrefix(status, "400 ") {
			t.Errorf("%q: %s", req, status)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	for _, u := range []string{hp, fmt.Sprintf("127.0.0.1:0%d", up.port)} {
		if status, _ := rawHTTP(t, on, "GET http://"+u+"/ HTTP/1.1\r\n\r\n"); !strings.HasPrefix(status, "200 ") {
			t.Errorf("positive control %s: %s", u, status)
		}
	}
}

// countingListener accepts connections, reads them to their end and
// counts those open.
type countingListener struct {
	port       uint16
	open, read atomic.Int64
}

func startCounting(t *testing.T) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c := &countingListener{port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.open.Add(1)
			go func() {
				n, _ := io.Copy(io.Discard, conn)
				c.read.Add(n)
				conn.Close()
				c.open.Add(-1)
			}()
		}
	}()
	return c
}

// TestRedteamHalfOpenConnects: CONNECTs that are answered 200 and never
// send a ClientHello hold a connection slot and a destination connection
// each, but only up to the computer's Conns (the next is refused) and
// HeaderTimeout (then both ends close and nothing was sent upstream).
// Positive control: under a long HeaderTimeout the same tunnels are
// still open after three times the short one.
func TestRedteamHalfOpenConnects(t *testing.T) {
	dst := startCounting(t)
	d := staticDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	pol := policy.Policy{Allow: []policy.Rule{{Host: "allowed.test", Ports: []uint16{dst.port}}}, Presets: []string{"lab"}}
	target := hostPortStr("allowed.test", dst.port)
	for _, c := range []struct {
		name    string
		timeout time.Duration
		closed  bool
	}{{"short", 300 * time.Millisecond, true}, {"long", time.Hour, false}} {
		l := newLab(t, egress.Config{DNS: d.addr, HeaderTimeout: c.timeout, Limits: egress.Limits{Conns: 4}})
		proxy, ref := l.attach(t, c.name, pol)
		var conns []net.Conn
		for range 4 {
			conn, _, status := connect(t, proxy, target)
			if !strings.HasPrefix(status, "200 ") {
				t.Fatalf("%s: CONNECT: %s", c.name, status)
			}
			conns = append(conns, conn)
		}
		if c.closed {
			extra, err := net.Dial("tcp", proxy)
			if err != nil {
				t.Fatal(err)
			}
			extra.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("the 5th connection: %v, want EOF", err)
			}
			extra.Close()
			if r := ref.next(t); r.Check != policy.CheckLimit {
				t.Errorf("refusal %+v", r)
			}
			for _, conn := range conns {
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("%s: a half-open tunnel: %v, want EOF at HeaderTimeout", c.name, err)
				}
			}
			waitFor(t, "the destination's ends closed", 5*time.Second, func() bool { return dst.open.Load() == 0 })
			if n := dst.read.Load(); n != 0 {
				t.Errorf("the destination read %d bytes", n)
			}
			continue
		}
		time.Sleep(900 * time.Millisecond) // three short HeaderTimeouts: nothing to wait for but time
		if n := dst.open.Load(); n != 4 {
			t.Errorf("positive control: %d destination connections open, want 4", n)
		}
		if s, _ := l.p.Stats(c.name); s.Open != 4 {
			t.Errorf("positive control: %d open", s.Open)
		}
	}
}

// TestRedteamClientNeverReads: a client that asks for 256 MiB and never
// reads stalls the copy: the proxy moves only what the sockets' buffers
// take, and holds no more than its copy buffer, instead of reading the
// destination into memory. Positive control: a reading client gets all.
func TestRedteamClientNeverReads(t *testing.T) {
	const size = 256 << 20
	up := bigUpstream(t, size)
	l := newLab(t, egress.Config{Limits: egress.Limits{BytesPerSecond: -1}})
	proxy, _ := l.attach(t, "a", allowPort(up.port, "lab"))
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, get("127.0.0.1", up.port))
	var last int64 = -1
	waitFor(t, "the copy to stall", 10*time.Second, func() bool {
		s, _ := l.p.Stats("a")
		stalled := s.BytesDown > 0 && s.BytesDown == last
		last = s.BytesDown
		if !stalled {
			time.Sleep(100 * time.Millisecond)
		}
		return stalled
	})
	if last > 32<<20 {
		t.Errorf("a client that never reads got %d bytes sent its way, want the sockets' buffers only", last)
	}
	t.Logf("stalled at %d bytes of %d", last, size)
	conn.Close()
	if n, _, err := download(proxy, fmt.Sprintf("http://127.0.0.1:%d/", up.port)); err != nil || n != size {
		t.Errorf("positive control: %d bytes, %v", n, err)
	}
}

// TestRedteamLogGrowthBounded: every connection is a record, so a
// computer that opens and closes connections as fast as it can grew the
// host's egress log without bound (measured: 41,726 records, 14.5 MB, in
// 2 s from one client goroutine). AcceptsPerSecond bounds how fast the
// proxy takes its connections (the rest wait in the backlog), and so the
// log's growth. Positive control: with no accept rate the same second of
// connections writes far more records.
func TestRedteamLogGrowthBounded(t *testing.T) {
	records := func(accepts int64) uint64 {
		l := newLab(t, egress.Config{Limits: egress.Limits{Conns: 8, AcceptsPerSecond: accepts}})
		proxy, _ := l.attach(t, "a", policy.Policy{})
		start := time.Now()
		for time.Since(start) < time.Second {
			if c, err := net.DialTimeout("tcp", proxy, 100*time.Millisecond); err == nil {
				c.Close()
			}
		}
		h, err := egresslog.Verify(l.logPath)
		if err != nil {
			t.Fatal(err)
		}
		return h.Records
	}
	limited, unlimited := records(50), records(-1)
	t.Logf("records after 1 s of connections: %d at 50 accepts/s (burst 8), %d with no accept rate", limited, unlimited)
	if limited > 8+50*3/2 {
		t.Errorf("%d records in 1 s at 50 accepts/s in bursts of 8", limited)
	}
	if unlimited < 500 {
		t.Errorf("positive control: only %d records in 1 s with no accept rate", unlimited)
	}
}

// TestRedteamRefusalHostIsPrintable: a SOCKS5 name carrying a newline
// or a terminal escape reaches the refused callback (and the log)
// escaped, so a reader that prints Refusal.Host as it is (the agent
// jail's stderr line) cannot be made to print a forged line or an escape.
// Positive control: that jail's line built from the raw name holds a
// second line and the escape byte.
func TestRedteamRefusalHostIsPrintable(t *testing.T) {
	l := newLab(t, egress.Config{})
	on, ref := l.attach(t, "on", policy.Policy{})
	line := func(host string) string {
		return fmt.Sprintf("tether jail: egress refused %s: %s (%s)\n", net.JoinHostPort(host, "80"), "x", "protocol")
	}
	for _, raw := range []string{"a\ntether jail: egress refused fake:1: forged (policy)", "\x1b]0;owned\x07b", "\xff.test"} {
		conn, code := socks5Connect(t, on, raw, 80)
		conn.Close()
		if code != 2 {
			t.Errorf("%q: reply %d", raw, code)
		}
		r := ref.next(t)
		for i := 0; i < len(r.Host); i++ {
			if r.Host[i] < 0x20 || r.Host[i] > 0x7e {
				t.Errorf("%q reported as %q", raw, r.Host)
				break
			}
		}
		if got := line(raw); raw[0] != '\xff' && !strings.ContainsAny(got[:len(got)-1], "\n\x1b") {
			t.Errorf("positive control: the raw name printed as %q", got)
		}
	}
	waitFor(t, "the records", 5*time.Second, func() bool { h, _ := egresslog.Verify(l.logPath); return h.Records == 3 })
	for _, r := range readLog(t, l.logPath) {
		if strings.ContainsAny(r.Host, "\n\x1b\x07") {
			t.Errorf("record %d: host %q", r.Seq, r.Host)
		}
	}
}

// TestRedteamResolveErrorNamesNoServer: when the host's DNS server fails,
// the reason the computer reads says so without naming the server (the
// host's resolver is internal). Positive control: the resolver's own
// error, which the reason used to carry, names it.
func TestRedteamResolveErrorNamesNoServer(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close() // nothing answers there
	l := newLab(t, egress.Config{DNS: dead, DialTimeout: 2 * time.Second})
	on, ref := l.attach(t, "on", allowPort(80))
	status, body := rawHTTP(t, on, get("pypi.test", 80))
	r := ref.next(t)
	if !strings.HasPrefix(status, "403 ") || r.Check != policy.CheckResolve || strings.Contains(status+body+r.Reason, dead) {
		t.Errorf("%s %q; refusal %+v", status, body, r)
	}
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, dead)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := res.LookupNetIP(ctx, "ip", "pypi.test."); err == nil || !strings.Contains(err.Error(), dead) {
		t.Errorf("positive control: the resolver's error %v does not name %s", err, dead)
	}
}
