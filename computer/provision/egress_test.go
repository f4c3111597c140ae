package provision

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// dialScript connects to 127.0.0.1:PORT from inside a computer with
// bash's /dev/tcp and says hello; it prints CONNECTED only if it could.
func dialScript(port int) string {
	return "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(port) + " && echo hello >&3 && echo CONNECTED"
}

// TestIntegrationEgressListener: the listener EgressListener opens lives
// in the computer's own network namespace. A command in that computer
// reaches it on 127.0.0.1:3128 and the host side accepts it (the
// positive control); a command in another computer is refused, and so is
// a client on the host's own loopback; a direct connect out of the
// computer has no route.
func TestIntegrationEgressListener(t *testing.T) {
	a, b := isolated(t, Options{}), isolated(t, Options{})
	ln, err := (&Machine{l: a}).EgressListener(ctxT(t, time.Minute), api.EgressPort)
	if err != nil {
		t.Fatalf("EgressListener: %v", err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		got <- line
	}()
	if r := runIn(t, a, dialScript(api.EgressPort)); !strings.Contains(r.out, "CONNECTED") {
		t.Fatalf("the computer's own command did not reach its listener: %v", r)
	}
	if line := <-got; line != "hello\n" {
		t.Fatalf("the host side accepted %q, want hello", line)
	}
	if r := runIn(t, b, dialScript(api.EgressPort)); strings.Contains(r.out, "CONNECTED") {
		t.Fatalf("another computer reached the listener: %v", r)
	}

	// The host's loopback: a port free there, listened on in the computer.
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	ln2, err := a.EgressListener(ctxT(t, time.Minute), port)
	if err != nil {
		t.Fatalf("EgressListener(%d): %v", port, err)
	}
	defer ln2.Close()
	if r := runIn(t, a, dialScript(port)); !strings.Contains(r.out, "CONNECTED") {
		t.Fatalf("positive control: the computer did not reach port %d: %v", port, r)
	}
	conn, err := net.DialTimeout("tcp4", ln2.Addr().String(), 5*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("the host's loopback reached the computer's listener on %d", port)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial from the host: %v, want connection refused", err)
	}
	checkNoRouteOut(t, a)
}

// checkNoRouteOut: a server on one of the host's own non-loopback
// addresses is reached from the host (the positive control) and not from
// inside the computer, whose namespace has no route: the proxy is the
// only way out.
func checkNoRouteOut(t *testing.T, c *Local) {
	t.Helper()
	ip := hostAddr(t)
	srv, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			conn, err := srv.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	port := srv.Addr().(*net.TCPAddr).Port
	conn, err := net.DialTimeout("tcp4", srv.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("positive control: the host does not reach its own %s: %v", srv.Addr(), err)
	}
	conn.Close()
	r := runIn(t, c, "exec 3<>/dev/tcp/"+ip+"/"+strconv.Itoa(port)+" && echo CONNECTED")
	if strings.Contains(r.out, "CONNECTED") || !strings.Contains(r.out, "Network is unreachable") {
		t.Fatalf("a direct connect from the computer to %s: %v; want no route", srv.Addr(), r)
	}
}

// hostAddr is one of the host's non-loopback IPv4 addresses.
func hostAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("the host has no non-loopback IPv4 address to try a direct connect to")
	return ""
}

// TestIntegrationEgressListenerReceiverGone: no listener for a computer
// whose receiver is stopped (nothing would pin its namespace).
func TestIntegrationEgressListenerReceiverGone(t *testing.T) {
	c := isolated(t, Options{})
	if err := c.StopReceiver(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EgressListener(ctxT(t, time.Minute), api.EgressPort); !errors.Is(err, ErrNoNetns) {
		t.Fatalf("EgressListener with the receiver stopped: %v, want ErrNoNetns", err)
	}
}

var proxyVars = []string{"ALL_PROXY=" + SocksURL, "HTTPS_PROXY=" + ProxyURL, "HTTP_PROXY=" + ProxyURL,
	"NO_PROXY=" + NoProxy, "all_proxy=" + SocksURL, "http_proxy=" + ProxyURL, "https_proxy=" + ProxyURL,
	"no_proxy=" + NoProxy}

// TestIntegrationEgressProxyEnv: a computer that uses the proxy gives its
// commands the eight proxy variables through the grant; without it they
// see none.
func TestIntegrationEgressProxyEnv(t *testing.T) {
	c := isolated(t, Options{})
	m := &Machine{l: c}
	env := func() string {
		if err := m.Grant(ctxT(t, time.Minute), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		return runIn(t, c, "env | grep -i _proxy= | LC_ALL=C sort").out
	}
	if out := env(); out != "" {
		t.Fatalf("without egress the commands see %q, want no proxy variable", out)
	}
	m.UseEgressProxy(true)
	if out, want := env(), strings.Join(proxyVars, "\n")+"\n"; out != want {
		t.Fatalf("with egress the commands see\n%s\nwant\n%s", out, want)
	}
	m.UseEgressProxy(false)
	if out := env(); out != "" {
		t.Fatalf("egress off again: the commands see %q", out)
	}
}

// TestIntegrationRefusalLog: a refusal shows as one line in the
// computer's RefusalLog, which its commands read and cannot write; a host
// name with a newline cannot forge a second line.
func TestIntegrationRefusalLog(t *testing.T) {
	c := isolated(t, Options{})
	r := policy.Refusal{Time: time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC), Host: "pypi.org\nforged", Port: 443,
		Check: policy.CheckPolicy, Reason: "no allow rule matches"}
	if err := (&Machine{l: c}).RecordRefusal(r); err != nil {
		t.Fatalf("RecordRefusal: %v", err)
	}
	out := runIn(t, c, "cat "+RefusalLog+"; stat -c '%u %a' /run/tether "+RefusalLog+
		"; echo x >> "+RefusalLog+" && echo WROTE; rm -f "+RefusalLog+" && echo REMOVED").out
	want := `2026-12-06T22:00:00Z refused "pypi.org\nforged:443" check="policy" reason="no allow rule matches"` + "\n" +
		"0 755\n0 644\n"
	if !strings.HasPrefix(out, want) || strings.Contains(out, "WROTE") || strings.Contains(out, "REMOVED") {
		t.Fatalf("in the computer:\n%s\nwant it to begin\n%s\nand no write or removal", out, want)
	}
}

// TestAppendBoundedRotates: past the bound the file becomes NAME.1 and a
// new one begins, so the two hold at most twice the bound.
func TestAppendBoundedRotates(t *testing.T) {
	testenv.Require(t, "root") // the file must be root's
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	line := strings.Repeat("x", 99) + "\n"
	for range 25 {
		if err := appendBounded(fd, "log", line, 1000); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := os.ReadFile(filepath.Join(dir, "log"))
	old, _ := os.ReadFile(filepath.Join(dir, "log.1"))
	if len(cur) != 500 || len(old) != 1000 {
		t.Fatalf("log %d bytes, log.1 %d bytes; want 500 and 1000", len(cur), len(old))
	}
}

// TestAppendBoundedRefusesSymlink: a symlink in the log's place is not
// followed (the attack a command could try if it could write the
// directory); the positive control shows a plain append would have
// written the target.
func TestAppendBoundedRefusesSymlink(t *testing.T) {
	testenv.Require(t, "root")
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "log")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := appendBounded(fd, "log", "line\n", 1000); err == nil {
		t.Fatal("appendBounded followed a symlink")
	}
	if b, _ := os.ReadFile(target); len(b) != 0 {
		t.Fatalf("the target got %q", b)
	}
	f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line\n")
	f.Close()
	if b, _ := os.ReadFile(target); string(b) != "line\n" {
		t.Fatalf("positive control: a plain append wrote %q to the target", b)
	}
}

// TestProxyURLsNameEgressPort: the environment points at api.EgressPort.
func TestProxyURLsNameEgressPort(t *testing.T) {
	port := ":" + strconv.Itoa(api.EgressPort)
	if !strings.HasSuffix(ProxyURL, port) || !strings.HasSuffix(SocksURL, port) {
		t.Fatalf("%s and %s, want port %d", ProxyURL, SocksURL, api.EgressPort)
	}
}

// TestRefusalLineLeavesOutAddr: a refusal's resolved address is not shown
// in the computer; the line keeps one line whatever the host holds.
func TestRefusalLineLeavesOutAddr(t *testing.T) {
	r := policy.Refusal{Time: time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC), Host: "db.internal\r\nx", Port: 5432,
		Addr: "10.1.2.3", Check: policy.CheckSpecialAddress, Reason: "a resolved address is private"}
	want := `2026-12-06T22:00:00Z refused "db.internal\r\nx:5432" check="special_address" reason="a resolved address is private"` + "\n"
	if got := RefusalLine(r); got != want {
		t.Fatalf("RefusalLine = %q, want %q", got, want)
	}
}

// TestIntegrationEgressAdopted: after a daemon restart the service asks
// an adopted machine (found through its state file, no exec.Cmd) for the
// listener and the refusal log; both reach the same computer, and the
// proxy environment comes back with the adopter's grant.
func TestIntegrationEgressAdopted(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	p := NewProvisioner(Config{Bins: receiverBins(t)})
	ctx := ctxT(t, 2*time.Minute)
	dir := prepare(t, p).Dir()
	got, err := p.Adopt(ctx, dir)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	m := got.(*Machine)
	m.UseEgressProxy(true)
	if err := m.Grant(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ln, err := m.EgressListener(ctx, api.EgressPort)
	if err != nil {
		t.Fatalf("EgressListener of the adopted machine: %v", err)
	}
	defer ln.Close()
	go func() {
		if conn, err := ln.Accept(); err == nil {
			conn.Close()
		}
	}()
	if err := m.RecordRefusal(policy.Refusal{Host: "x.example", Port: 443, Check: policy.CheckPolicy, Reason: "r"}); err != nil {
		t.Fatalf("RecordRefusal on the adopted machine: %v", err)
	}
	out := runIn(t, m.Local(), dialScript(api.EgressPort)+"; grep -c x.example "+RefusalLog+"; echo $HTTPS_PROXY").out
	if want := "CONNECTED\n1\n" + ProxyURL + "\n"; out != want {
		t.Fatalf("in the adopted computer: %q, want %q", out, want)
	}
}
