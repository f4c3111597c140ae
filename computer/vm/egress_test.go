package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/fakenet"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// vmEgressScript runs as the grant's user in the guest: the network
// devices its kernel has (/proc/net/dev: Landlock keeps /sys from the
// commands), curl over HTTP and HTTPS to the allowed name through
// the proxy the grant's environment names (the positive control), the
// same server reached directly (curl with no proxy; a python socket to
// port 80, and to the egress port that Landlock lets it connect to, so
// only the missing route refuses it), then a name the policy does not
// allow, whose refusal line reaches the guest's log a moment after the
// 403 (waited for). Each step prints its mark only if it worked.
const vmEgressScript = `set -u
cd ` + GuestRoot + `
cat > ca.pem <<'PEM'
CAPEM
PEM
echo "NET $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
curl -sf http://WEB/ >/dev/null && echo "CURL HTTP"
curl -sf --cacert ca.pem https://WEB/ >/dev/null && echo "CURL HTTPS"
curl -s --noproxy '*' --max-time 5 http://ADDR/ >/dev/null && echo "DIRECT REACHED"
python3 -c '
import socket, sys
for port in (80, 3128):
    try:
        socket.create_connection(("ADDR", port), timeout=5)
        print("PY REACHED", port)
    except OSError as e:
        print("PY REFUSED", port, e)
'
echo "DENIED $(curl -s -o /dev/null -w '%{http_code}' http://OTHER/)"
for i in $(seq 100); do grep -qF '"OTHER:80"' REFUSALS 2>/dev/null && break; sleep 0.1; done
cat REFUSALS`

// vmTunnelScript holds a TLS session to the allowed name open through a
// CONNECT tunnel, reading until it ends.
const vmTunnelScript = `cd ` + GuestRoot + ` && exec python3 -c '
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT WEB:443 HTTP/1.1\r\nHost: WEB:443\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
t = ssl.create_default_context(cafile="ca.pem").wrap_socket(s, server_hostname="WEB")
print("TUNNEL OPEN", flush=True)
try:
    while t.recv(4096):
        pass
except OSError:
    pass
print("TUNNEL ENDED", flush=True)
'`

// TestIntegrationVMEgress: a VM computer whose policy allows one name of
// the fake internet reaches it only through the egress proxy: curl as
// the grant's user fetches it over HTTP and HTTPS with no setup but the
// CA, a name the policy does not allow is refused (403) and its refusal
// shows in the guest, a direct connection that ignores the proxy fails
// (the guest has no interface but lo), and once the policy is set to
// deny all, an open tunnel ends and the allowed name is refused too; a
// delete of the computer suspended in the middle of a download does not
// wait for its stopped guest. One boot.
func TestIntegrationVMEgress(t *testing.T) {
	testenv.Require(t, "root", "qemu", "guestimage", "fakenet")
	p, base := testProvisioner(t)
	fnet := fakenet.Start(t, fakenet.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	preset := policy.Preset{Name: "fakenet", AllowCIDRs: []string{fnet.Prefix.String()}}
	proxy, err := egress.New(egress.Config{Presets: []policy.Preset{preset}, DNS: fnet.DNSAddr.String(),
		LogPath: filepath.Join(base, "egress.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s, err := service.Open(ctx, service.Config{Dir: filepath.Join(base, "svc"),
		Provisioner:  provision.NewProvisioner(provision.Config{Bins: p.cfg.Bins}),
		Provisioners: map[string]api.Provisioner{api.TierVM: p}, Egress: proxy, EgressPresets: []string{"fakenet"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	alice := api.Caller{Owner: "alice"}
	allow := policy.Policy{Allow: []policy.Rule{{Host: fakenet.NameWeb}}, Presets: []string{"fakenet"}}
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 256 << 20}, Egress: allow})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Egress(ctx, alice, c.ID); err != nil || !info.Attached || info.RefusalLog != ctl.RefusalLog {
		t.Fatalf("egress of the VM computer: %+v, %v", info, err)
	}
	ca, err := os.ReadFile(fnet.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	d := dialerOf(t, c)
	out := runVia(t, ctx, d, c.Tuple, strings.NewReplacer("CAPEM", strings.TrimSpace(string(ca)), "WEB", fakenet.NameWeb,
		"OTHER", fakenet.NameOther, "ADDR", fnet.Addr.String(), "REFUSALS", ctl.RefusalLog).Replace(vmEgressScript))
	t.Logf("in the guest:\n%s", out)
	for _, bad := range []string{"DIRECT REACHED", "PY REACHED"} {
		if strings.Contains(out, bad) {
			t.Errorf("a connection that ignores the proxy reached the fake internet (%s)", bad)
		}
	}
	for _, want := range []string{"NET lo \n", "CURL HTTP\n", "CURL HTTPS\n", "PY REFUSED 80", "PY REFUSED 3128 [Errno 101]",
		"DENIED 403\n", `refused "` + fakenet.NameOther + `:80" check="policy"`} {
		if !strings.Contains(out, want) {
			t.Errorf("in the guest: missing %q", want)
		}
	}
	if st, ok := proxy.Stats(c.ID); !ok || st.BytesDown == 0 || st.Refused < 1 {
		t.Errorf("proxy stats %+v (attached %v): want bytes down and a refusal", st, ok)
	}

	// Deny all: an open tunnel to the allowed name ends, and the name is
	// refused from now on.
	tunnel := startVia(t, ctx, d, *c.Tuple, strings.ReplaceAll(vmTunnelScript, "WEB", fakenet.NameWeb))
	tunnel.waitFor(t, ctx, "TUNNEL OPEN\n", time.Minute)
	time.Sleep(2 * time.Second) // positive control: while allowed, the tunnel stays open
	if out := tunnel.output(t, ctx); strings.Contains(out, "TUNNEL ENDED") {
		t.Fatalf("the tunnel ended while its name was allowed:\n%s", out)
	}
	set := time.Now()
	if _, err := s.SetEgress(ctx, alice, c.ID, policy.Policy{}); err != nil {
		t.Fatal(err)
	}
	tunnel.waitFor(t, ctx, "TUNNEL ENDED\n", 5*time.Second)
	t.Logf("deny-all -> the guest's tunnel ended: %s", time.Since(set).Round(time.Millisecond))
	out = runVia(t, ctx, d, c.Tuple, strings.NewReplacer("WEB", fakenet.NameWeb, "REFUSALS", ctl.RefusalLog).Replace(
		`echo "AFTER $(curl -s -o /dev/null -w '%{http_code}' http://WEB/)"
for i in $(seq 100); do grep -qF '"WEB:80"' REFUSALS 2>/dev/null && break; sleep 0.1; done
grep -F '"WEB:80"' REFUSALS`))
	t.Logf("after deny-all:\n%s", out)
	if !strings.Contains(out, "AFTER 403\n") || !strings.Contains(out, `refused "`+fakenet.NameWeb+`:80"`) {
		t.Errorf("after egress set to deny all, the allowed name was not refused")
	}
	deleteMidDownload(t, ctx, s, proxy, c, allow)
}

// deleteMidDownload allows the name again, starts the 64 MiB download
// in the guest, suspends the computer once the proxy has carried 4 MiB
// of it (the proxy then writes to a guest that reads nothing), and
// deletes it: the detach must not wait for the stopped guest, and the
// proxy serves the computer no more.
func deleteMidDownload(t *testing.T, ctx context.Context, s *service.Service, proxy *egress.Proxy, c api.Computer, allow policy.Policy) {
	t.Helper()
	alice := api.Caller{Owner: "alice"}
	if _, err := s.SetEgress(ctx, alice, c.ID, allow); err != nil {
		t.Fatal(err)
	}
	before, _ := proxy.Stats(c.ID)
	startVia(t, ctx, dialerOf(t, c), *c.Tuple, "cd "+GuestRoot+" && curl -s --cacert ca.pem -o /dev/null https://"+
		fakenet.NameWeb+fakenet.PathTarball)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if st, _ := proxy.Stats(c.ID); st.BytesDown-before.BytesDown >= 4<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the download did not start")
		}
	}
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := s.Delete(dctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("delete of the suspended computer mid-download: %s", time.Since(start).Round(time.Millisecond))
	if _, ok := proxy.Stats(c.ID); ok {
		t.Error("the proxy still serves the deleted computer")
	}
}

// started is a command running in a computer, its output read as it
// comes.
type started struct {
	c      *wireclient.Client
	digest string
	id     string
}

// startVia starts a shell line as tu's grant through d without waiting
// for it; the client closes at the test's end.
func startVia(t *testing.T, ctx context.Context, d provision.Dialer, tu admission.Tuple, line string) *started {
	t.Helper()
	c, err := provision.WireClient(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	digest := tu.SHA256()
	var st wire.ExecStartResult
	if err := c.Call(ctx, wire.OpExecStart, digest, fmt.Sprintf("probe-%d", probeSeq.Add(1)), time.Now().Add(time.Minute),
		wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", line}, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &st); err != nil {
		t.Fatal(err)
	}
	return &started{c: c, digest: digest, id: st.TerminalID}
}

func (s *started) output(t *testing.T, ctx context.Context) string {
	t.Helper()
	var o wire.ExecOutputResult
	if err := s.c.Call(ctx, wire.OpExecOutput, s.digest, fmt.Sprintf("probe-%d", probeSeq.Add(1)), time.Now().Add(time.Minute),
		wire.TerminalArgs{TerminalID: s.id}, &o); err != nil {
		t.Fatal(err)
	}
	return o.Output
}

// waitFor polls the output until it holds want, failing after within.
func (s *started) waitFor(t *testing.T, ctx context.Context, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out := s.output(t, ctx)
		if strings.Contains(out, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the command's output lacks %q:\n%s", within, want, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
