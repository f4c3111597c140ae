package custodian

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
)

// Grant identity of the real receiver's children in these tests.
const (
	grantUID = 60411
	grantGID = 60412
)

// realReceiver is a tether-receiver process (built from this module)
// serving a host-only unix socket, with a signed admission file granting
// one tuple whose root is a fresh directory.
type realReceiver struct {
	sock  string
	tuple admission.Tuple
	cmd   *exec.Cmd
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// buildBinary builds one of this module's commands once per test process.
func buildBinary(t testing.TB, pkg, name string) string {
	t.Helper()
	binOnce.Do(func() { binDir, binErr = os.MkdirTemp("", "tether-custodian-test-bin-") })
	if binErr != nil {
		t.Fatal(binErr)
	}
	out := filepath.Join(binDir, name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out
}

func startReceiver(t testing.TB) *realReceiver {
	t.Helper()
	testenv.Require(t, "root")
	bin := buildBinary(t, "github.com/tetherdev/tether/receiver/cmd/tether-receiver", "tether-receiver")
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		must(t, os.Chmod(d, 0o755))
	}
	adm, run, root := filepath.Join(base, "admission"), filepath.Join(base, "run"), filepath.Join(base, "roots", "w1")
	must(t, os.Mkdir(adm, 0o755))
	must(t, os.Mkdir(run, 0o755))
	must(t, os.MkdirAll(root, 0o755))
	must(t, os.Chown(root, grantUID, grantGID))
	key, err := signing.GenerateKey()
	must(t, err)
	pubPath := filepath.Join(base, "admission.pub")
	must(t, signing.WritePublicKey(pubPath, key.Public()))
	rr := &realReceiver{sock: filepath.Join(run, "receiver.sock"), tuple: admission.Tuple{Owner: "alice",
		Allocation: "a1", Session: "s1", Workspace: "w1", Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: root}}
	rr.publish(t, adm, key)
	cfg := map[string]any{
		"listen":    []any{map[string]any{"unix": map[string]any{"path": rr.sock, "host_only": true}}},
		"admission": map[string]any{"file": filepath.Join(adm, admission.FileName), "public_key": pubPath, "owner_uid": 0},
		"landlock":  map[string]any{"mode": "off"},
	}
	cfgPath := filepath.Join(base, "receiver.json")
	data, _ := json.Marshal(cfg)
	must(t, os.WriteFile(cfgPath, data, 0o600))
	rr.cmd = exec.Command(bin, "--config", cfgPath)
	rr.cmd.Stderr = &prefixWriter{t: t, prefix: "tether-receiver: "}
	must(t, rr.cmd.Start())
	t.Cleanup(func() {
		rr.cmd.Process.Signal(syscall.SIGTERM)
		rr.cmd.Wait()
	})
	rr.waitUp(t)
	return rr
}

func (rr *realReceiver) publish(t testing.TB, dir string, key signing.PrivateKey) {
	t.Helper()
	pub, err := admission.NewPublisher(admission.PublisherConfig{Dir: dir, Key: key})
	must(t, err)
	now := time.Now()
	g := admission.Grant{Tuple: rr.tuple, UID: grantUID, GID: grantGID, Groups: []uint32{},
		Ops:      []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill},
		Limits:   admission.Limits{MaxProcs: 16, MaxRuntimeS: 600, MaxOutputBytes: 64 << 10, MaxFileBytes: 1 << 20},
		NotAfter: now.Add(time.Hour)}
	_, err = pub.Publish(context.Background(), admission.PublishInput{NotAfter: now.Add(2 * time.Hour), Grants: []admission.Grant{g}})
	must(t, err)
}

func (rr *realReceiver) waitUp(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(rr.sock); err == nil {
			return
		}
		if rr.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("tether-receiver did not listen on %s", rr.sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialer dials the receiver as the custodian does.
func (rr *realReceiver) dialer() Dialer {
	return StreamDialer(transport.Unix{Path: rr.sock, HostOnly: true}.Dial, wire.ClientConfig{})
}

// file returns the path of rel inside the tuple's root.
func (rr *realReceiver) file(rel string) string { return filepath.Join(rr.tuple.Root, rel) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type prefixWriter struct {
	t      testing.TB
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) {
			fmt.Fprintln(os.Stderr, w.prefix+l)
		}
	}
	return len(p), nil
}
