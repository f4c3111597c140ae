package service

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/egress"
	"github.com/tetherdev/tether/egress/policy"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/fakenet"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// fakenetScript is what an agent does in a computer whose policy allows
// the fake internet's web name: curl over HTTP and HTTPS, git clone over
// HTTPS, pip install from the simple index into a venv, a 64 MiB tarball
// checked by its digest, a direct connect that bypasses the proxy (no
// route), then a name the policy does not allow, whose refusal reaches
// the computer's file a moment after the 403 (waited for). No step
// names the proxy: the grant's environment does. Each step prints its
// mark only if it worked.
const fakenetScript = `set -u
cd "$HOME"
curl -sf http://WEB/ >/dev/null && echo "CURL HTTP"
curl -sf https://WEB/ >/dev/null && echo "CURL HTTPS"
git clone -q https://WEB/GITPATH repo && echo "GIT $(git -C repo rev-parse HEAD)"
python3 -m venv venv && venv/bin/python -m pip install -q --disable-pip-version-check --no-input --no-cache-dir \
    --index-url https://WEB/simple/ PACKAGE && echo "PIP OK"
echo "TAR $(curl -sf https://WEB/big.tar | sha256sum | cut -d' ' -f1)"
curl -s --noproxy '*' --max-time 5 http://ADDR/ >/dev/null && echo "DIRECT REACHED"
echo "DENIED $(curl -s -o /dev/null -w '%{http_code}' http://OTHER/)"
for i in $(seq 200); do grep -qF '"OTHER:80"' ` + provision.RefusalLog + ` 2>/dev/null && break; sleep 0.05; done
cat ` + provision.RefusalLog

// TestIntegrationEgressFakeInternet: the real service, provisioner and
// proxy, and real clients inside a real computer against the fake
// internet (fixtures/fakenet): curl, git, pip and a 64 MiB download reach
// the allowed name with no setup; a name the policy does not allow is
// refused (403) and the refusal shows in the computer. The positive
// control of the refusal is the allowed name on the same server.
func TestIntegrationEgressFakeInternet(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop", "fakenet")
	net := fakenet.Start(t, fakenet.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set, err := bins.Build(ctx, bins.Receiver)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	// The fake internet's range is private: only an operator's preset
	// lifts it.
	preset := policy.Preset{Name: "fakenet", AllowCIDRs: []string{net.Prefix.String()}}
	proxy, err := egress.New(egress.Config{Presets: []policy.Preset{preset}, DNS: net.DNSAddr.String(),
		LogPath: filepath.Join(dir, "egress.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s := openReal(t, Config{Dir: filepath.Join(dir, "state"), Provisioner: provision.NewProvisioner(provision.Config{Bins: set}),
		Egress: proxy, EgressPresets: []string{"fakenet"}})
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: api.Limits{MemoryBytes: 1 << 30, DiskBytes: 256 << 20},
		Egress: policy.Policy{Allow: []policy.Rule{{Host: fakenet.NameWeb}}, Presets: []string{"fakenet"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	m := s.computers[c.ID].m.(*provision.Machine)
	s.mu.Unlock()
	script := strings.NewReplacer("WEB", fakenet.NameWeb, "OTHER", fakenet.NameOther, "GITPATH",
		strings.TrimPrefix(fakenet.PathGit, "/"), "PACKAGE", fakenet.PackageName, "ADDR", net.Addr.String()).Replace(fakenetScript)
	out := runInMachine(ctx, t, m, trustCA(t, m, net.CAFile)+script)
	if strings.Contains(out, "DIRECT REACHED") {
		t.Errorf("a direct connect (no proxy) from the computer reached the fake internet:\n%s", out)
	}
	for _, want := range []string{"CURL HTTP\n", "CURL HTTPS\n", "GIT " + net.RepoHead + "\n", "PIP OK\n",
		"TAR " + net.TarballSHA256 + "\n", "DENIED 403\n",
		`refused "` + fakenet.NameOther + `:80" check="policy"`} {
		if !strings.Contains(out, want) {
			t.Errorf("in the computer: missing %q; output:\n%s", want, out)
		}
	}
	st, ok := proxy.Stats(c.ID)
	if !ok || st.BytesDown < net.TarballLen || st.Refused < 1 {
		t.Errorf("proxy stats %+v (attached %v): want the tarball's %d bytes down and a refusal", st, ok, net.TarballLen)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := proxy.Stats(c.ID); ok {
		t.Error("the proxy still serves the deleted computer")
	}
}

// trustCA copies the fake internet's CA into the computer's root and
// returns the shell lines that make curl, git and pip trust it.
func trustCA(t *testing.T, m *provision.Machine, caFile string) string {
	t.Helper()
	root, uid, gid := m.Root()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "ca.pem")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	in := strconv.Quote(m.Tuple().Root + "/ca.pem")
	return "export SSL_CERT_FILE=" + in + " CURL_CA_BUNDLE=" + in + " GIT_SSL_CAINFO=" + in + " PIP_CERT=" + in + "\n"
}
