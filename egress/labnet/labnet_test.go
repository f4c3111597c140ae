package labnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const page = "hello from the lab network\n"

// start makes a Net with a plain web server on port 80 that answers
// page, and closes it when the test ends.
func start(t *testing.T) *Net {
	t.Helper()
	testenv.Require(t, "root")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx, Options{Ports: []int{80}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := n.ServeHTTP(80, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, page) })); err != nil {
		t.Fatal(err)
	}
	return n
}

// get fetches url from the host's namespace and returns its body.
func get(t *testing.T, url string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestNewRefusesBadPorts: port 53 is DNS's, and a port must be 1-65535.
func TestNewRefusesBadPorts(t *testing.T) {
	for _, p := range []int{0, 53, 65536} {
		if n, err := New(context.Background(), Options{Ports: []int{p}}); err == nil {
			n.Close()
			t.Fatalf("New with port %d succeeded", p)
		}
	}
}

// TestIntegrationServeAndDNS: the web server answers on Addr, a port not
// asked for is refused with ErrNoPort, and the DNS server answers A and
// AAAA from the Zone, NXDOMAIN for any other name, and alternates a
// rebinding name with TTL 0.
func TestIntegrationServeAndDNS(t *testing.T) {
	n := start(t)
	if got, err := get(t, fmt.Sprintf("http://%s/", n.Addr)); err != nil || got != page {
		t.Fatalf("GET: %q, %v; want %q", got, err, page)
	}
	if err := n.ServeHTTP(443, http.NotFoundHandler()); !errors.Is(err, ErrNoPort) {
		t.Fatalf("ServeHTTP on a port not asked for: %v, want ErrNoPort", err)
	}
	v6 := netip.MustParseAddr("2001:db8::7")
	n.Zone.Set("web.lab.test", 30, n.Addr, v6)
	if got, _ := answers(t, n, "web.lab.test", dns.TypeA); strings.Join(got, " ") != n.Addr.String() {
		t.Fatalf("A: %v, want [%s]", got, n.Addr)
	}
	if got, _ := answers(t, n, "web.lab.test", dns.TypeAAAA); strings.Join(got, " ") != v6.String() {
		t.Fatalf("AAAA: %v, want [%s]", got, v6)
	}
	if r := query(t, n, "nowhere.lab.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("unknown name: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	n.Zone.Set("web.lab.test", 30)
	if r := query(t, n, "web.lab.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("removed name: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	bad := netip.MustParseAddr("127.0.0.1")
	n.Zone.SetAlternating("rebind.lab.test", n.Addr, bad)
	var seq []string
	for i := 0; i < 4; i++ {
		got, ttls := answers(t, n, "rebind.lab.test", dns.TypeA)
		if len(got) != 1 || ttls[0] != 0 {
			t.Fatalf("rebind query %d: %v ttl %v, want one answer with TTL 0", i, got, ttls)
		}
		seq = append(seq, got[0])
	}
	if want := strings.Repeat(n.Addr.String()+" "+bad.String()+" ", 2); strings.Join(seq, " ")+" " != want {
		t.Fatalf("rebind sequence %v, want %q", seq, want)
	}
}

func query(t *testing.T, n *Net, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, n.DNSAddr.String())
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r
}

func answers(t *testing.T, n *Net, name string, qtype uint16) (out []string, ttls []uint32) {
	t.Helper()
	for _, rr := range query(t, n, name, qtype).Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		}
		ttls = append(ttls, rr.Header().Ttl)
	}
	return out, ttls
}

// TestIntegrationIsolation: no thread of this process is left in the
// namespace, and the namespace has no default route (it reaches only the
// host end of its veth).
func TestIntegrationIsolation(t *testing.T) {
	n := start(t)
	if tasks := tasksIn(n.Namespace); len(tasks) > 0 {
		t.Fatalf("threads %v are in the lab network's namespace", tasks)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(n.ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	linkLocal := netip.MustParsePrefix("fe80::/10")
	for _, r := range routes {
		p, ok := toPrefix(r.Dst)
		if !ok || p.Bits() == 0 || r.Gw != nil || !n.Prefix.Contains(p.Addr()) && !linkLocal.Contains(p.Addr()) {
			t.Fatalf("namespace route %v leads outside %s", r, n.Prefix)
		}
	}
	if len(routes) == 0 {
		t.Fatal("positive control: the namespace has no route even to its own range")
	}
}

// TestIntegrationParallel: two Nets at once get different ranges and
// each serves on its own address.
func TestIntegrationParallel(t *testing.T) {
	a, b := start(t), start(t)
	if a.Prefix.Overlaps(b.Prefix) {
		t.Fatalf("ranges overlap: %s and %s", a.Prefix, b.Prefix)
	}
	for _, n := range []*Net{a, b} {
		if got, err := get(t, fmt.Sprintf("http://%s/", n.Addr)); err != nil || got != page {
			t.Fatalf("%s: %q, %v", n.Addr, got, err)
		}
	}
}

// TestIntegrationCloseLeavesNothing: after Close the veth pair, the
// route, the range's claim and every reference of this process to the
// namespace are gone, and the server does not answer.
func TestIntegrationCloseLeavesNothing(t *testing.T) {
	n := start(t)
	name, prefix, ino := n.link.name, n.Prefix, n.Namespace
	if _, err := netlink.LinkByName(name); err != nil {
		t.Fatalf("veth %s missing while running: %v", name, err)
	}
	if !hasFD(ino) {
		t.Fatal("positive control: no fd of this process refers to the running namespace")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := netlink.LinkByName(name); !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Fatalf("veth %s after Close: %v", name, err)
	}
	if err := checkFree(prefix); err != nil {
		t.Fatalf("range %s after Close: %v", prefix, err)
	}
	lock, err := net.ListenUnix("unix", &net.UnixAddr{Name: claimPrefix + prefix.String(), Net: "unix"})
	if err != nil {
		t.Fatalf("range %s still claimed: %v", prefix, err)
	}
	lock.Close()
	if hasFD(ino) || len(tasksIn(ino)) > 0 {
		t.Fatal("this process still refers to the namespace")
	}
	// The machine may route the address elsewhere (its default route),
	// so the check is that no page of ours comes back.
	if got, err := get(t, fmt.Sprintf("http://%s/", n.Addr)); err == nil && got == page {
		t.Fatal("the web server answers after Close")
	}
}

// tasksIn lists this process's threads in the namespace with inode ino.
func tasksIn(ino uint64) []string {
	paths, _ := filepath.Glob("/proc/self/task/*/ns/net")
	var in []string
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && st.Ino == ino {
			in = append(in, p)
		}
	}
	return in
}

// hasFD reports whether a file descriptor of this process is the
// namespace with inode ino.
func hasFD(ino uint64) bool {
	want := fmt.Sprintf("net:[%d]", ino)
	paths, _ := filepath.Glob("/proc/self/fd/*")
	for _, p := range paths {
		if l, err := os.Readlink(p); err == nil && l == want {
			return true
		}
	}
	return false
}
