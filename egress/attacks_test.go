package egress_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/egresslog"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestAttackIPLiterals: every literal form of loopback, metadata and
// private addresses is refused (403, special_address) although the
// policy allows every address on the port; lifting loopback with a
// preset (the positive control) lets the loopback forms reach the
// upstream, which shows each form is read as the address it names.
func TestAttackIPLiterals(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	on, onRef := l.attach(t, "on", allowPort(up.port))
	off, _ := l.attach(t, "off", allowPort(up.port, "lab"))
	loopback := []string{"127.0.0.1", "2130706433", "0x7f.1", "0x7f000001", "0177.0.0.1", "127.1", "017700000001",
		"[::ffff:127.0.0.1]", "[0:0:0:0:0:ffff:7f00:1]", "[::ffff:7f00:1]"}
	for _, h := range loopback {
		status, body := rawHTTP(t, on, get(h, up.port))
		if !strings.HasPrefix(status, "403 ") || !strings.Contains(body, "special_address") {
			t.Errorf("%s with the check on: %s %q", h, status, body)
		}
		if r := onRef.next(t); r.Check != policy.CheckSpecialAddress || r.Addr == "" {
			t.Errorf("%s: refusal %+v", h, r)
		}
		if status, body := rawHTTP(t, off, get(h, up.port)); !strings.HasPrefix(status, "200 ") || !strings.HasPrefix(body, "hello") {
			t.Errorf("%s with loopback lifted: %s %q", h, status, body)
		}
	}
	for _, h := range []string{"169.254.169.254", "0xa9fea9fe", "169.254.43518", "10.0.0.1", "192.168.0.1", "100.64.0.1",
		"[::1]", "[fd00::1]", "[fe80::1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "0", "[::]", "224.0.0.1"} {
		status, body := rawHTTP(t, on, get(h, up.port))
		if !strings.HasPrefix(status, "403 ") || !strings.Contains(body, "check special_address") {
			t.Errorf("%s: %s %q", h, status, body)
		}
	}
	for _, h := range []string{"256.0.0.1", "0x7g.1", "1.2.3.4.5"} {
		if status, _ := rawHTTP(t, on, get(h, up.port)); !strings.HasPrefix(status, "403 ") && !strings.HasPrefix(status, "400 ") {
			t.Errorf("malformed %s: %s", h, status)
		}
	}
	if up.hits.Load() != int64(len(loopback)) {
		t.Errorf("upstream saw %d requests, want only the %d of the positive control", up.hits.Load(), len(loopback))
	}
}

// TestAttackConnectToHostLoopback: CONNECT and SOCKS5 to a loopback
// port are refused; with loopback lifted the same tunnel opens.
func TestAttackConnectToHostLoopback(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	pol := allowPort(up.port)
	pol.AllowNoSNI = true
	on, _ := l.attach(t, "on", pol)
	pol.Presets = []string{"lab"}
	off, _ := l.attach(t, "off", pol)
	for _, target := range []string{up.addr, fmt.Sprintf("[::ffff:127.0.0.1]:%d", up.port), fmt.Sprintf("2130706433:%d", up.port)} {
		if _, _, status := connect(t, on, target); !strings.HasPrefix(status, "403 ") {
			t.Errorf("CONNECT %s with the check on: %s", target, status)
		}
		conn, br, status := connect(t, off, target)
		if !strings.HasPrefix(status, "200 ") {
			t.Fatalf("CONNECT %s with loopback lifted: %s", target, status)
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
			t.Errorf("through the tunnel: %v, %v", resp, err)
		}
	}
	if _, code := socks5Connect(t, on, "127.0.0.1", up.port); code != 2 {
		t.Errorf("SOCKS5 to loopback with the check on: reply %d, want 2", code)
	}
	if _, code := socks5Connect(t, off, "127.0.0.1", up.port); code != 0 {
		t.Errorf("SOCKS5 to loopback lifted: reply %d, want 0", code)
	}
}

// TestAttackHostOwnAddress: an address of the proxy host's own
// interfaces is refused even where it is global; lifted (positive
// control), the proxy goes on to connect (whatever answers, or a 502
// where the test host has no route out).
func TestAttackHostOwnAddress(t *testing.T) {
	own := ownAddress(t)
	up := startUpstream(t, netip.AddrPortFrom(own, 0).String(), nil)
	l := newLab(t, egress.Config{HostAddrs: []netip.Addr{own}, DialTimeout: time.Second,
		Presets: []policy.Preset{{Name: "self", AllowCIDRs: []string{own.String() + "/32"}}}})
	on, ref := l.attach(t, "on", allowPort(up.port))
	off, _ := l.attach(t, "off", allowPort(up.port, "self"))
	if status, body := rawHTTP(t, on, get(own.String(), up.port)); !strings.HasPrefix(status, "403 ") || !strings.Contains(body, "own addresses") {
		t.Errorf("the host's own address: %s %q", status, body)
	}
	if r := ref.next(t); r.Check != policy.CheckSpecialAddress || r.Addr != own.String() {
		t.Errorf("refusal %+v", r)
	}
	if status, body := rawHTTP(t, off, get(own.String(), up.port)); !strings.HasPrefix(status, "200 ") {
		t.Errorf("the host's own address, lifted: %s %q, want 200 from the upstream", status, body)
	}
}

// ownAddress gives the host an address of its own that no special range
// holds, on a veth of its own so that nothing leaves this machine (a
// global address from 44.0.0.0/8, shadowed on this host only while the
// test runs), and removes it when the test ends.
func ownAddress(t *testing.T) netip.Addr {
	testenv.Require(t, "root")
	name := fmt.Sprintf("tthown%d", os.Getpid()%100000)
	own := netip.AddrFrom4([4]byte{44, 0, 0, byte(1 + os.Getpid()%250)})
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("link", "add", name, "type", "veth", "peer", "name", name+"p")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	run("addr", "add", own.String()+"/32", "dev", name)
	run("link", "set", name, "up")
	run("link", "set", name+"p", "up")
	return own
}

// TestAttackNameResolvesToRefused: a name answering a refused address,
// and a name with one good and one bad answer, are refused; lifting the
// bad address (positive control) lets both through. A name no rule
// allows is not even resolved.
func TestAttackNameResolvesToRefused(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	up2 := startUpstream(t, fmt.Sprintf("127.0.0.2:%d", up.port), nil)
	d := staticDNS(t, map[string][]string{"bad.test": {"127.0.0.2"}, "mixed.test": {"127.0.0.1", "127.0.0.2"},
		"good.test": {"127.0.0.1"}, "exfil.test": {"127.0.0.1"}, "aaaa.test": {"127.0.0.1", "::1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	names := []policy.Rule{{Host: "bad.test", Ports: []uint16{up.port}}, {Host: "mixed.test", Ports: []uint16{up.port}},
		{Host: "good.test", Ports: []uint16{up.port}}, {Host: "aaaa.test", Ports: []uint16{up.port}}}
	on, onRef := l.attach(t, "on", policy.Policy{Allow: names, Presets: []string{"lab1"}})
	off, _ := l.attach(t, "off", policy.Policy{Allow: names, Presets: []string{"lab"}})
	for name, bad := range map[string]string{"bad.test": "127.0.0.2", "mixed.test": "127.0.0.2", "aaaa.test": "::1"} {
		status, body := rawHTTP(t, on, get(name, up.port))
		if !strings.HasPrefix(status, "403 ") || !strings.Contains(body, "special_address") {
			t.Errorf("%s: %s %q", name, status, body)
		}
		if r := onRef.next(t); r.Check != policy.CheckSpecialAddress || r.Addr != bad {
			t.Errorf("%s: refusal %+v", name, r)
		}
		if status, _ := rawHTTP(t, off, get(name, up.port)); !strings.HasPrefix(status, "200 ") {
			t.Errorf("%s lifted: %s", name, status)
		}
	}
	if status, _ := rawHTTP(t, on, get("good.test", up.port)); !strings.HasPrefix(status, "200 ") {
		t.Errorf("good.test: %s", status)
	}
	if status, _ := rawHTTP(t, on, get("exfil.test", up.port)); !strings.HasPrefix(status, "403 ") {
		t.Errorf("exfil.test: %s", status)
	}
	if r := onRef.next(t); r.Check != policy.CheckPolicy || d.count("exfil.test") != 0 {
		t.Errorf("a name no rule allows: %+v, %d queries sent", r, d.count("exfil.test"))
	}
	if status, _ := rawHTTP(t, on, get("nx.test", up.port)); !strings.HasPrefix(status, "403 ") {
		t.Errorf("nx.test: %s", status)
	}
	if up2.hits.Load() == 0 {
		t.Error("the positive control never reached 127.0.0.2")
	}
}

// TestAttackRebindingTTL0: a name whose TTL-0 answers alternate between
// a lifted and a refused address never reaches the refused one: each
// connection resolves once and connects to what it checked. With both
// lifted (positive control) the rebinding target is reached.
func TestAttackRebindingTTL0(t *testing.T) {
	good := startUpstream(t, "127.0.0.1:0", nil)
	evil := startUpstream(t, fmt.Sprintf("127.0.0.2:%d", good.port), nil)
	d := startDNS(t, func(name string, n int) []string {
		if n%2 == 0 {
			return []string{"127.0.0.1"}
		}
		return []string{"127.0.0.2"}
	})
	l := newLab(t, egress.Config{DNS: d.addr})
	rule := []policy.Rule{{Host: "rebind.test", Ports: []uint16{good.port}}}
	on, _ := l.attach(t, "on", policy.Policy{Allow: rule, Presets: []string{"lab1"}})
	const rounds = 20
	ok, refused := 0, 0
	for i := 0; i < rounds; i++ {
		status, body := rawHTTP(t, on, get("rebind.test", good.port))
		switch {
		case strings.HasPrefix(status, "200 ") && strings.Contains(body, "127.0.0.1:"):
			ok++
		case strings.HasPrefix(status, "403 "):
			refused++
		default:
			t.Errorf("round %d: %s %q", i, status, body)
		}
	}
	if evil.hits.Load() != 0 || ok == 0 || refused == 0 {
		t.Fatalf("rebinding: %d allowed, %d refused, %d reached 127.0.0.2", ok, refused, evil.hits.Load())
	}
	if q := d.count("rebind.test"); q != rounds {
		t.Errorf("%d A queries for %d connections: the proxy must resolve exactly once each", q, rounds)
	}
	off, _ := l.attach(t, "off", policy.Policy{Allow: rule, Presets: []string{"lab"}})
	for i := 0; i < 4; i++ {
		rawHTTP(t, off, get("rebind.test", good.port))
	}
	if evil.hits.Load() == 0 {
		t.Error("positive control: with 127.0.0.2 lifted the rebinding target was never reached")
	}
}

// TestAttackHostHeaderMismatch: an absolute URL whose Host header names
// another host is refused; the matching header passes.
func TestAttackHostHeaderMismatch(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	on, ref := l.attach(t, "on", allowPort(up.port, "lab"))
	hp := hostPortStr("127.0.0.1", up.port)
	for _, hdr := range []string{"Host: metadata.google.internal", "Host: " + hp + "\r\nHost: evil.example"} {
		status, body := rawHTTP(t, on, fmt.Sprintf("GET http://%s/ HTTP/1.1\r\n%s\r\n\r\n", hp, hdr))
		if !strings.HasPrefix(status, "403 ") || !strings.Contains(body, "host_header") {
			t.Errorf("%q: %s %q", hdr, status, body)
		}
		if r := ref.next(t); r.Check != policy.CheckHostHeader {
			t.Errorf("%q: refusal %+v", hdr, r)
		}
	}
	for _, hdr := range []string{"Host: " + hp, "Host: " + hostPortStr("0x7f.1", up.port)} {
		if status, _ := rawHTTP(t, on, fmt.Sprintf("GET http://%s/ HTTP/1.1\r\n%s\r\n\r\n", hp, hdr)); !strings.HasPrefix(status, "200 ") {
			t.Errorf("%q: %s", hdr, status)
		}
	}
	if status, _ := rawHTTP(t, on, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hp)); !strings.HasPrefix(status, "403 ") {
		t.Errorf("an origin-form request: %s", status)
	}
}

// TestAttackRedirectToInternal: the proxy hands a redirect to the client
// as it came; when the client follows it to the metadata address through
// the proxy, that request is refused. With the target lifted (positive
// control) the client's follow-up goes through.
func TestAttackRedirectToInternal(t *testing.T) {
	target := startUpstream(t, "127.0.0.2:0", nil)
	var location string
	up := startUpstream(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, location, http.StatusFound)
	}))
	l := newLab(t, egress.Config{})
	pol := allowPort(up.port, "lab1")
	pol.Allow = append(pol.Allow, policy.Rule{CIDR: "0.0.0.0/0", Ports: []uint16{80, target.port}})
	on, ref := l.attach(t, "on", pol)
	client := func(proxy string) *http.Client {
		return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxy})}}
	}
	for _, loc := range []string{"http://169.254.169.254/latest/meta-data/", fmt.Sprintf("http://127.0.0.2:%d/", target.port)} {
		location = loc
		resp, err := client(on).Get(fmt.Sprintf("http://127.0.0.1:%d/", up.port))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("redirect to %s: %s", loc, resp.Status)
		}
		if r := ref.next(t); r.Check != policy.CheckSpecialAddress {
			t.Errorf("redirect to %s: refusal %+v", loc, r)
		}
	}
	pol.Presets = []string{"lab"}
	off, _ := l.attach(t, "off", pol)
	resp, err := client(off).Get(fmt.Sprintf("http://127.0.0.1:%d/", up.port))
	if err != nil || resp.StatusCode != 200 || target.hits.Load() != 1 {
		t.Fatalf("positive control: %v %v, target hits %d", resp, err, target.hits.Load())
	}
	resp.Body.Close()
}

// TestAttackPolicyChangeClosesTunnel: removing the rule under an open
// tunnel closes it within one second, measured from SetPolicy's return
// to the client's read ending; a change that still allows the tunnel
// (positive control) leaves it open.
func TestAttackPolicyChangeClosesTunnel(t *testing.T) {
	echo := startEcho(t)
	d := staticDNS(t, map[string][]string{"echo.test": {"127.0.0.1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	allow := policy.Policy{Allow: []policy.Rule{{Host: "echo.test", Ports: []uint16{echo.port}}}, Presets: []string{"lab"},
		AllowNoSNI: true}
	proxy, ref := l.attach(t, "c", allow)
	conn, br, status := connect(t, proxy, hostPortStr("echo.test", echo.port))
	if !strings.HasPrefix(status, "200 ") {
		t.Fatal(status)
	}
	roundTrip := func() error {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, "ping\n")
		line, err := br.ReadString('\n')
		if err == nil && line != "ping\n" {
			err = fmt.Errorf("echo %q", line)
		}
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	still := allow
	still.Deny = []policy.Rule{{Host: "other.test"}}
	if err := l.p.SetPolicy(context.Background(), "c", still); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(); err != nil {
		t.Fatalf("positive control: a change that still allows the tunnel closed it: %v", err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := l.p.SetPolicy(context.Background(), "c", policy.Policy{Presets: []string{"lab"}}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	_, err := br.ReadByte()
	closedAfter := time.Since(changed)
	if err == nil || closedAfter > time.Second {
		t.Fatalf("the tunnel closed after %v (%v), want within 1 s", closedAfter, err)
	}
	if r := ref.next(t); r.Check != policy.CheckPolicyChanged {
		t.Errorf("refusal %+v", r)
	}
	t.Logf("tunnel closed %v after the change", closedAfter)
}

// TestAttackSNIMismatch: a tunnel to a.test whose ClientHello names
// b.test is refused; the matching name passes; no SNI passes only when
// the policy allows it.
func TestAttackSNIMismatch(t *testing.T) {
	tlsUp := startTLSUpstream(t)
	d := staticDNS(t, map[string][]string{"a.test": {"127.0.0.1"}})
	l := newLab(t, egress.Config{DNS: d.addr})
	rule := []policy.Rule{{Host: "a.test", Ports: []uint16{tlsUp.port}}}
	strict, ref := l.attach(t, "strict", policy.Policy{Allow: rule, Presets: []string{"lab"}})
	loose, _ := l.attach(t, "loose", policy.Policy{Allow: rule, Presets: []string{"lab"}, AllowNoSNI: true})
	target := hostPortStr("a.test", tlsUp.port)
	cases := []struct {
		proxy, sni string
		want       bool
		check      string
	}{
		{strict, "b.test", false, policy.CheckSNI},
		{loose, "b.test", false, ""},
		{strict, "a.test", true, ""},
		{strict, "A.Test", true, ""},
		{strict, "", false, policy.CheckSNI},
		{loose, "", true, ""},
	}
	for _, tc := range cases {
		err := tlsThrough(t, tc.proxy, target, tc.sni)
		if (err == nil) != tc.want {
			t.Errorf("proxy %s, SNI %q: %v, want success %v", tc.proxy, tc.sni, err, tc.want)
		}
		if tc.check != "" {
			if r := ref.next(t); r.Check != tc.check {
				t.Errorf("SNI %q: refusal %+v", tc.sni, r)
			}
		}
	}
	for sni, want := range map[string]bool{"b.test": false, "a.test": true} {
		conn, code := socks5Connect(t, strict, "a.test", tlsUp.port)
		if code != 0 {
			t.Fatalf("SOCKS5 to a.test: reply %d", code)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		err := tls.Client(conn, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
		if (err == nil) != want {
			t.Errorf("SOCKS5 to a.test with SNI %q: %v, want success %v", sni, err, want)
		}
	}
}

// TestServerSpeaksFirstNeedsAllowNoSNI: a tunnel whose client sends
// nothing (the server speaks first) is refused at HeaderTimeout; under
// allow_no_sni it opens then and the banner arrives.
func TestServerSpeaksFirstNeedsAllowNoSNI(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "220 banner\r\n")
			c.Close()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	l := newLab(t, egress.Config{HeaderTimeout: 300 * time.Millisecond})
	strict, ref := l.attach(t, "strict", allowPort(port, "lab"))
	pol := allowPort(port, "lab")
	pol.AllowNoSNI = true
	loose, _ := l.attach(t, "loose", pol)
	for _, tc := range []struct {
		proxy  string
		banner bool
	}{{strict, false}, {loose, true}} {
		conn, br, status := connect(t, tc.proxy, hostPortStr("127.0.0.1", port))
		if !strings.HasPrefix(status, "200 ") {
			t.Fatal(status)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadString('\n')
		if got := err == nil && line == "220 banner\r\n"; got != tc.banner {
			t.Errorf("allow_no_sni %v: %q, %v", tc.banner, line, err)
		}
	}
	if r := ref.next(t); r.Check != policy.CheckSNI {
		t.Errorf("refusal %+v", r)
	}
}

// TestAttackUnknownPreset: Attach and SetPolicy refuse a policy naming a
// preset the operator did not configure; a configured one passes.
func TestAttackUnknownPreset(t *testing.T) {
	l := newLab(t, egress.Config{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	err := l.p.Attach(context.Background(), "x", policy.Policy{Presets: []string{"everything"}}, ln, nil)
	if !errors.Is(err, policy.ErrUnknownPreset) {
		t.Fatalf("Attach: %v", err)
	}
	l.attach(t, "y", policy.Policy{})
	if err := l.p.SetPolicy(context.Background(), "y", policy.Policy{Presets: []string{"everything"}}); !errors.Is(err, policy.ErrUnknownPreset) {
		t.Fatalf("SetPolicy: %v", err)
	}
	if err := l.p.SetPolicy(context.Background(), "y", policy.Policy{Presets: []string{"lab"}}); err != nil {
		t.Fatalf("SetPolicy with a known preset: %v", err)
	}
	if err := l.p.SetPolicy(context.Background(), "nobody", policy.Policy{}); !errors.Is(err, egress.ErrUnknown) {
		t.Fatalf("SetPolicy of an unknown computer: %v", err)
	}
	if err := l.p.Attach(context.Background(), "y", policy.Policy{}, ln, nil); !errors.Is(err, egress.ErrAttached) {
		t.Fatal("attaching y twice")
	}
}

// TestListenerNamesTheComputer: a connection is judged by the policy of
// the computer whose listener accepted it and recorded under its id; the
// log verifies and holds every connection with its address, rule and
// bytes.
func TestListenerNamesTheComputer(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	a, _ := l.attach(t, "a", allowPort(up.port, "lab"))
	b, _ := l.attach(t, "b", policy.Policy{Presets: []string{"lab"}})
	if status, _ := rawHTTP(t, a, get("127.0.0.1", up.port)); !strings.HasPrefix(status, "200 ") {
		t.Errorf("a: %s", status)
	}
	if status, _ := rawHTTP(t, b, get("127.0.0.1", up.port)); !strings.HasPrefix(status, "403 ") {
		t.Errorf("b: %s", status)
	}
	waitFor(t, "both records", 5*time.Second, func() bool { h, _ := egresslog.Verify(l.logPath); return h.Records == 2 })
	recs := readLog(t, l.logPath)
	got := map[string]egresslog.Record{}
	for _, r := range recs {
		got[r.Computer] = r
	}
	if r := got["a"]; r.Verdict != egresslog.Allowed || r.Addr != "127.0.0.1" || r.Rule != "allow cidr 0.0.0.0/0" || r.Down == 0 || r.Up == 0 {
		t.Errorf("a's record: %+v", r)
	}
	if r := got["b"]; r.Verdict != egresslog.Refused || r.Check != policy.CheckPolicy || r.Port != up.port {
		t.Errorf("b's record: %+v", r)
	}
	if s, ok := l.p.Stats("b"); !ok || s.Refused != 1 {
		t.Errorf("b's stats: %+v", s)
	}
}

// TestSetPolicyWhileConnecting: policy changes racing with new requests
// (run under -race); once the deny-all policy is set, no request passes.
func TestSetPolicyWhileConnecting(t *testing.T) {
	up := startUpstream(t, "127.0.0.1:0", nil)
	l := newLab(t, egress.Config{})
	proxy, _ := l.attach(t, "c", allowPort(up.port, "lab"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var done atomic.Int64
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c, err := net.Dial("tcp", proxy); err == nil {
					io.WriteString(c, get("127.0.0.1", up.port))
					io.Copy(io.Discard, c)
					c.Close()
					done.Add(1)
				}
			}
		}()
	}
	for i := 0; i < 50; i++ {
		n := done.Load()
		waitFor(t, "a request under this policy", 10*time.Second, func() bool { return done.Load() > n })
		pol := allowPort(up.port, "lab")
		if i%2 == 1 {
			pol = policy.Policy{Presets: []string{"lab"}}
		}
		if err := l.p.SetPolicy(context.Background(), "c", pol); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.p.SetPolicy(context.Background(), "c", policy.Policy{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if status, _ := rawHTTP(t, proxy, get("127.0.0.1", up.port)); !strings.HasPrefix(status, "403 ") {
			t.Errorf("after deny-all: %s", status)
		}
	}
	close(stop)
	wg.Wait()
	if up.hits.Load() == 0 {
		t.Error("no request passed while the policy allowed it: the race was not exercised")
	}
}
