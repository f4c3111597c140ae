package vm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm/ctl"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/fakenet"
	"github.com/tetherdev/tether/fixtures/testenv"
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

// TestIntegrationVMEgress: a VM computer whose policy allows one name of
// the fake internet reaches it only through the egress proxy: curl as
// the grant's user fetches it over HTTP and HTTPS with no setup but the
// CA, a name the policy does not allow is refused (403) and its refusal
// shows in the guest, a direct connection that ignores the proxy fails
// (the guest has no interface but lo), and once the policy is set to
// deny all, the allowed name is refused too. One boot.
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
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Limits: api.Limits{MemoryBytes: 256 << 20},
		Egress: policy.Policy{Allow: []policy.Rule{{Host: fakenet.NameWeb}}, Presets: []string{"fakenet"}}})
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

	// Deny all: the name allowed a moment ago is refused now.
	if _, err := s.SetEgress(ctx, alice, c.ID, policy.Policy{}); err != nil {
		t.Fatal(err)
	}
	out = runVia(t, ctx, d, c.Tuple, strings.NewReplacer("WEB", fakenet.NameWeb, "REFUSALS", ctl.RefusalLog).Replace(
		`echo "AFTER $(curl -s -o /dev/null -w '%{http_code}' http://WEB/)"
for i in $(seq 100); do grep -qF '"WEB:80"' REFUSALS 2>/dev/null && break; sleep 0.1; done
grep -F '"WEB:80"' REFUSALS`))
	t.Logf("after deny-all:\n%s", out)
	if !strings.Contains(out, "AFTER 403\n") || !strings.Contains(out, `refused "`+fakenet.NameWeb+`:80"`) {
		t.Errorf("after egress set to deny all, the allowed name was not refused")
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := proxy.Stats(c.ID); ok {
		t.Error("the proxy still serves the deleted computer")
	}
}
