package jail

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/fakenet"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// envNet makes the test binary the network agent: it runs netPlan and
// prints a netReport.
const envNet = "TETHER_JAIL_TEST_NET"

// netPlan is what the network agent tries from inside the jail.
type netPlan struct {
	// Allowed and Refused are URLs fetched through the proxy the
	// environment names (Go's client, HTTP forward).
	Allowed, Refused string
	// CurlHTTPS is fetched by the real curl through the proxy (CONNECT),
	// trusting CAFile; Curl is curl's path.
	CurlHTTPS, Curl, CAFile string
	// CurlLoopback is fetched by curl through the proxy: a service on
	// the host's loopback, which the proxy must refuse.
	CurlLoopback string
	// Direct is a fake-internet address:port dialled without the proxy;
	// Loopback a service on the host's loopback.
	Direct, Loopback string
}

// netReport is what the network agent saw.
type netReport struct {
	Allowed, Refused string // "200 <body>" or the error
	CurlHTTPS        string
	CurlLoopback     string // curl's exit through the proxy
	Direct, Loopback string // errName of the dial
	LoopbackDown     string // errName of taking the jail's lo down (SIOCSIFFLAGS)
	Proxy            string // HTTPS_PROXY as the agent sees it
}

// netMain is the network agent.
func netMain(planJSON string) int {
	var p netPlan
	if err := json.Unmarshal([]byte(planJSON), &p); err != nil {
		fmt.Fprintln(os.Stderr, "net agent: plan:", err)
		return 2
	}
	r := netReport{Proxy: os.Getenv("HTTPS_PROXY")}
	client := &http.Client{Timeout: 20 * time.Second,
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true}}
	get := func(url string) string {
		if url == "" {
			return ""
		}
		resp, err := client.Get(url)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return strconv.Itoa(resp.StatusCode) + " " + string(body)
	}
	r.Allowed, r.Refused = get(p.Allowed), get(p.Refused)
	if p.CurlHTTPS != "" {
		out, err := exec.Command(p.Curl, "-sS", "--fail", "--max-time", "20", "--cacert", p.CAFile, p.CurlHTTPS).CombinedOutput()
		r.CurlHTTPS = errName(err) + " " + string(out)
	}
	if p.CurlLoopback != "" {
		_, err := exec.Command(p.Curl, "-sS", "--fail", "--max-time", "20", p.CurlLoopback).CombinedOutput()
		r.CurlLoopback = errName(err)
	}
	dial := func(addr string) string {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
		}
		return errName(err)
	}
	r.Direct, r.Loopback = dial(p.Direct), dial(p.Loopback)
	r.LoopbackDown = errName(loopbackDown())
	json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// loopbackDown tries to take lo down: reconfiguring the namespace needs
// CAP_NET_ADMIN over it, which the agent lacks.
func loopbackDown() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// stubEgress is an Egress that must not be used (Build only checks that
// one is given).
type stubEgress struct{}

var _ Egress = stubEgress{}

func (stubEgress) Attach(context.Context, string, policy.Policy, net.Listener, func(policy.Refusal)) error {
	panic("stubEgress: Attach")
}

func (stubEgress) Detach(context.Context, string) error { panic("stubEgress: Detach") }

// newEgress starts the real egress proxy (package egress) resolving
// through the fake internet's DNS, with a preset, "fakenet", that lifts
// the fake internet's private range.
func newEgress(t *testing.T, n *fakenet.Net) *egress.Proxy {
	t.Helper()
	p, err := egress.New(egress.Config{
		Presets: []policy.Preset{{Name: "fakenet", AllowCIDRs: []string{n.Prefix.String()}}},
		DNS:     n.DNSAddr.String(), LogPath: filepath.Join(t.TempDir(), "egress.log")})
	mustDo(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// jailUID reads the jail's uid from its start-up line.
func jailUID(t *testing.T, stderr string) string {
	t.Helper()
	_, rest, ok := strings.Cut(stderr, "the agent runs confined: uid ")
	uid, _, _ := strings.Cut(rest, " ")
	if !ok || uid == "" {
		t.Fatalf("no uid in the jail's start-up line:\n%s", stderr)
	}
	return uid
}

// startNetAgent starts the network agent in a jail of cfg and returns
// its report and the jail's stderr once it has ended.
func startNetAgent(t *testing.T, s *scene, cfg Config, eg Egress, p netPlan) (netReport, string) {
	t.Helper()
	planJSON, err := json.Marshal(p)
	mustDo(t, err)
	if p.Curl != "" {
		cfg.Exec = append(cfg.Exec, p.Curl)
		cfg.Read = append(cfg.Read, filepath.Dir(p.CAFile))
	}
	spec, err := Build(Options{Config: cfg, Argv: []string{s.exe, "jail-net"}, Root: s.root,
		Env: append(holdEnv(), envNet+"="+string(planJSON)), Hidden: []string{s.state, s.key}, Helper: s.exe, Egress: eg})
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	if err != nil {
		t.Fatalf("start: %v\nstderr:\n%s", err, stderr)
	}
	defer func() { proc.Kill(); proc.Stdin.Close(); proc.Stdout.Close(); proc.Wait() }()
	var r netReport
	if err := json.NewDecoder(proc.Stdout).Decode(&r); err != nil {
		t.Fatalf("the network agent's report: %v\nstderr:\n%s", err, stderr)
	}
	proc.Stdin.Close()
	if err := proc.Wait(); err != nil {
		t.Fatalf("jail: %v\nstderr:\n%s", err, stderr)
	}
	return r, stderr.String()
}

// TestIntegrationJailNetworkProxy: under network proxy the jailed agent
// reaches the allowed host of the fake internet through the real egress
// proxy (Go's client by HTTP forward, the real curl by CONNECT with TLS),
// is refused another host of the same server and, through the proxy, a
// service on the host's loopback (each refusal printed on the jail's
// stderr), cannot connect directly to the fake internet (no route) or to
// the host's loopback (its own), and cannot take its lo down. Positive
// control: the same agent under network host connects to both directly.
func TestIntegrationJailNetworkProxy(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "fakenet")
	n := fakenet.Start(t, fakenet.Options{})
	s := newScene(t)
	caDir := filepath.Join(s.base, "ca")
	mustDo(t, os.MkdirAll(caDir, 0o755))
	ca, err := os.ReadFile(n.CAFile)
	mustDo(t, err)
	caFile := filepath.Join(caDir, "ca.pem")
	mustDo(t, os.WriteFile(caFile, ca, 0o644))
	curl, err := exec.LookPath("curl")
	mustDo(t, err)
	_, loopback := listeners(t, s.id)
	plan := netPlan{Allowed: n.URL("http", fakenet.PathPage), Refused: "http://" + fakenet.NameOther + "/",
		CurlHTTPS: n.URL("https", fakenet.PathPage), Curl: curl, CAFile: caFile, CurlLoopback: "http://" + loopback + "/",
		Direct: net.JoinHostPort(n.Addr.String(), "80"), Loopback: loopback}
	eg := newEgress(t, n)
	pol := &policy.Policy{Allow: []policy.Rule{{Host: fakenet.NameWeb}}, Presets: []string{"fakenet"}}

	r, stderr := startNetAgent(t, s, Config{Network: NetworkProxy, Egress: pol}, eg, plan)
	t.Logf("the jail's stderr:\n%s", stderr)
	if want := "200 " + fakenet.Page; r.Allowed != want {
		t.Errorf("allowed host through the proxy: %q, want %q\nstderr:\n%s", r.Allowed, want, stderr)
	}
	if want := "ok " + fakenet.Page; r.CurlHTTPS != want {
		t.Errorf("curl over HTTPS through the proxy: %q, want %q", r.CurlHTTPS, want)
	}
	if !strings.HasPrefix(r.Refused, "403 ") {
		t.Errorf("refused host through the proxy: %q, want 403", r.Refused)
	}
	if want := "tether jail: egress refused " + fakenet.NameOther + ":80: "; !strings.Contains(stderr, want) || !strings.Contains(stderr, "(policy)\n") {
		t.Errorf("stderr lacks %q...(policy):\n%s", want, stderr)
	}
	if r.CurlLoopback != "exit 22" {
		t.Errorf("curl of the host's loopback %s through the proxy: %s, want exit 22 (HTTP 403 from the proxy)", loopback, r.CurlLoopback)
	}
	if want := "tether jail: egress refused " + loopback + ": "; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
	if r.Direct != "ENETUNREACH" {
		t.Errorf("direct connect to the fake internet %s: %s, want ENETUNREACH (no route)", plan.Direct, r.Direct)
	}
	if r.Loopback != "ECONNREFUSED" {
		t.Errorf("connect to the host's loopback %s: %s, want ECONNREFUSED (the jail's own loopback)", loopback, r.Loopback)
	}
	if r.LoopbackDown != "EPERM" {
		t.Errorf("taking the jail's lo down: %s, want EPERM (the agent cannot reconfigure its namespace)", r.LoopbackDown)
	}
	if r.Proxy != "http://127.0.0.1:3128" {
		t.Errorf("HTTPS_PROXY in the jail: %q", r.Proxy)
	}
	if !strings.Contains(stderr, "tether jail: network proxy: own network namespace") {
		t.Errorf("the banner does not state the network:\n%s", stderr)
	}
	if st, ok := eg.Stats("agent-jail-" + jailUID(t, stderr)); ok {
		t.Errorf("after the jail ended the proxy still serves it: %+v", st)
	}

	// Positive control: network host, no proxy.
	plan.Allowed, plan.Refused, plan.CurlHTTPS, plan.Curl, plan.CurlLoopback = "", "", "", "", ""
	r, stderr = startNetAgent(t, s, Config{Network: NetworkHost}, nil, plan)
	if r.Direct != "ok" || r.Loopback != "ok" {
		t.Errorf("network host: direct %s, loopback %s; want both ok\nstderr:\n%s", r.Direct, r.Loopback, stderr)
	}
}
