// Package realrecv starts a real tether-receiver process for the
// custodian's integration tests: the binary is built from this module, it
// serves a host-only unix socket, and a signed admission file grants one
// tuple whose root is a fresh directory. It needs root (testenv "root").
package realrecv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/fixtures/testids"
)

var (
	idsOnce            sync.Once
	grantUID, grantGID uint32
)

// GrantIDs returns the uid and gid the receivers of this test process
// grant: fresh for the process (fixtures/testids), drawn at the first
// call, so no other test binary's commands run as them (two packages use
// this one, and tests wait for or kill the processes of their grant).
func GrantIDs() (uid, gid uint32) {
	idsOnce.Do(func() {
		ids := testids.Must(2)
		grantUID, grantGID = ids[0], ids[1]
	})
	return grantUID, grantGID
}

// Receiver is a tether-receiver process (built from this module)
// serving a host-only unix socket, with a signed admission file granting
// one tuple (or Options.Tuples) whose root is a fresh directory, and a
// fence state file (docs/protocol.md "Fencing").
type Receiver struct {
	// Sock is the unix socket it serves (host-only).
	Sock string
	// Tuple is the granted tuple; its Root is a directory owned by the
	// grant's uid (GrantIDs).
	Tuple admission.Tuple
	// Tuples are every granted tuple (Tuple is the first), each with its
	// own root.
	Tuples []admission.Tuple
	// FenceState is the receiver's fence state file.
	FenceState string
	bin, cfg   string
	t          testing.TB
	cmd        *exec.Cmd
	exited     chan struct{}
}

// Options tune Start.
type Options struct {
	// Tuples is how many tuples are granted (default 1), each with its
	// own root (roots/w1, w2, ...) and session field (s1, s2, ...).
	Tuples int
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// Cleanup removes the binaries BuildBinary built; call it from TestMain
// after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// BuildBinary builds one of this module's commands once per test process.
func BuildBinary(t testing.TB, pkg, name string) string {
	t.Helper()
	binOnce.Do(func() { binDir, binErr = os.MkdirTemp("", "tether-custodian-test-bin-") })
	if binErr != nil {
		t.Fatal(binErr)
	}
	out := filepath.Join(binDir, name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	cmd := exec.Command(goTool(), "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out
}

// Start builds and starts a receiver granting one tuple; it is stopped
// (SIGTERM) when t ends. Without root it skips, or fails when
// TETHER_TEST_REQUIRE names root.
func Start(t testing.TB) *Receiver { return StartWith(t, Options{}) }

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Receiver {
	t.Helper()
	testenv.Require(t, "root")
	bin := BuildBinary(t, "github.com/tetherdev/tether/receiver/cmd/tether-receiver", "tether-receiver")
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		Must(t, os.Chmod(d, 0o755))
	}
	adm, run, fence := filepath.Join(base, "admission"), filepath.Join(base, "run"), filepath.Join(base, "fence")
	Must(t, os.Mkdir(adm, 0o755))
	Must(t, os.Mkdir(run, 0o755))
	Must(t, os.Mkdir(fence, 0o700))
	key, err := signing.GenerateKey()
	Must(t, err)
	pubPath := filepath.Join(base, "admission.pub")
	Must(t, signing.WritePublicKey(pubPath, key.Public()))
	rr := &Receiver{Sock: filepath.Join(run, "receiver.sock"), FenceState: filepath.Join(fence, "fence.json"), bin: bin, t: t}
	for i := 1; i <= max(o.Tuples, 1); i++ {
		root := filepath.Join(base, "roots", fmt.Sprintf("w%d", i))
		Must(t, os.MkdirAll(root, 0o755))
		uid, gid := GrantIDs()
		Must(t, os.Chown(root, int(uid), int(gid)))
		rr.Tuples = append(rr.Tuples, admission.Tuple{Owner: "alice", Allocation: "a1", Session: fmt.Sprintf("s%d", i),
			Workspace: fmt.Sprintf("w%d", i), Sandbox: "sb1", Generation: 1, Executor: "e1", Site: "local", Root: root})
	}
	rr.Tuple = rr.Tuples[0]
	rr.publish(t, adm, key)
	cfg := map[string]any{
		"listen":      []any{map[string]any{"kind": "unix", "path": rr.Sock, "host_only": true}},
		"admission":   map[string]any{"file": filepath.Join(adm, admission.FileName), "public_key": pubPath, "owner_uid": 0},
		"landlock":    map[string]any{"mode": "off"},
		"fence_state": rr.FenceState,
		"limits":      map[string]any{"max_terminals": 1024},
	}
	rr.cfg = filepath.Join(base, "receiver.json")
	data, _ := json.Marshal(cfg)
	Must(t, os.WriteFile(rr.cfg, data, 0o600))
	rr.start(t)
	t.Cleanup(rr.stop)
	return rr
}

// start runs the receiver process on the config and waits until it listens.
func (rr *Receiver) start(t testing.TB) {
	t.Helper()
	os.Remove(rr.Sock)
	rr.cmd = exec.Command(rr.bin, "--config", rr.cfg)
	rr.cmd.Stderr = &prefixWriter{t: t, prefix: "tether-receiver: "}
	Must(t, rr.cmd.Start())
	exited := make(chan struct{})
	rr.exited = exited
	cmd := rr.cmd
	go func() { cmd.Wait(); close(exited) }()
	rr.waitUp(t)
}

// stop ends the receiver process (SIGTERM) and waits for it.
func (rr *Receiver) stop() {
	rr.cmd.Process.Signal(syscall.SIGTERM)
	<-rr.exited
}

// Restart stops the receiver process and starts a new one on the same
// configuration, admission file and fence state.
func (rr *Receiver) Restart(t testing.TB) {
	t.Helper()
	rr.stop()
	rr.start(t)
}

func (rr *Receiver) publish(t testing.TB, dir string, key signing.PrivateKey) {
	t.Helper()
	pub, err := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: dir, Key: key})
	Must(t, err)
	now := time.Now()
	uid, gid := GrantIDs()
	var gs []admission.Grant
	for _, tu := range rr.Tuples {
		gs = append(gs, admission.Grant{Tuple: tu, UID: uid, GID: gid, Groups: []uint32{},
			Ops:      []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill},
			Limits:   admission.Limits{MaxProcs: 16, MaxRuntimeS: 600, MaxOutputBytes: 64 << 10, MaxFileBytes: 64 << 20},
			NotAfter: now.Add(time.Hour)})
	}
	_, err = pub.Publish(context.Background(), admission.PublishInput{NotAfter: now.Add(2 * time.Hour), Grants: gs})
	Must(t, err)
}

// waitUp waits until the receiver accepts a connection: the socket file
// exists from bind, a moment before listen, so its presence alone is not
// enough (a dial in between is refused).
func (rr *Receiver) waitUp(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.DialTimeout("unix", rr.Sock, time.Second); err == nil {
			c.Close()
			return
		}
		select {
		case <-rr.exited:
			t.Fatalf("tether-receiver exited before listening on %s (its stderr is above)", rr.Sock)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("tether-receiver did not listen on %s", rr.Sock)
		}
	}
}

// File returns the path of rel inside the tuple's root.
func (rr *Receiver) File(rel string) string { return filepath.Join(rr.Tuple.Root, rel) }

// Must fails t on a non-nil err.
func Must(t testing.TB, err error) {
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

// goTool is the go command of the toolchain running the tests, or "go".
func goTool() string {
	if root := runtime.GOROOT(); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// PID is the receiver process's id (benchmarks read its CPU time).
func (r *Receiver) PID() int { return r.cmd.Process.Pid }

// WaitChildrenGone waits until no process of the grant's uid (GrantIDs) is left: every
// command the receiver started has exited and been reaped. The bound is
// for a slow machine; the wait ends as soon as the condition holds.
func WaitChildrenGone(t testing.TB) {
	t.Helper()
	uid, _ := GrantIDs()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := processesOf(int(uid))
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of the grant's uid %d are still running", left, uid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processesOf lists the processes whose real uid is uid, from /proc.
func processesOf(uid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == strconv.Itoa(uid) {
				out = append(out, pid)
			}
		}
	}
	return out
}
