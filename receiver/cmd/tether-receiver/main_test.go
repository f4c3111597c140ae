package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/pki"
	"github.com/tetherdev/tether/fixtures/ports"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/fixtures/testids"
	"github.com/tetherdev/tether/receiver/caps"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
	"github.com/tetherdev/tether/receiver/transport"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// The binary under test is built once, with CGO_ENABLED=0 as the Makefile
// builds it (caps.Narrow needs that), unless EnvPrebuilt names one.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// EnvPrebuilt names a prebuilt tether-receiver (an absolute path to an
// executable regular file, built with CGO_ENABLED=0 and -trimpath) that
// these tests run instead of building one. ci/vm-receipts sets it in its
// guest, which has no Go toolchain. Only these tests read it; a value that
// names no executable fails them, never falls back to a build.
const EnvPrebuilt = "TETHER_TEST_RECEIVER_BIN"

func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if p, ok := os.LookupEnv(EnvPrebuilt); ok {
			binPath, buildErr = prebuilt(p)
			return
		}
		dir, err := os.MkdirTemp("", "tether-receiver-bin-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755)
		binPath = filepath.Join(dir, "tether-receiver")
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// prebuilt checks the binary EnvPrebuilt names.
func prebuilt(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s=%q: not an absolute path", EnvPrebuilt, p)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvPrebuilt, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s=%q: not an executable regular file (%v)", EnvPrebuilt, p, fi.Mode())
	}
	return p, nil
}

func capsh(t testing.TB) string {
	t.Helper()
	testenv.Require(t, "capsh")
	p, err := exec.LookPath("capsh")
	if err != nil {
		t.Fatalf("capsh not found (ci/setup installs libcap2-bin): %v", err)
	}
	return p
}

// The grant's ids are this test process's own (fixtures/testids): tests
// count, wait for and kill every process of gUID, which another test
// binary running at the same time must never add to or lose. (No test
// here re-executes this binary, so they are drawn at initialisation.)
var (
	grantIDs           = testids.Must(3)
	gUID, gGID, gGroup = grantIDs[0], grantIDs[1], grantIDs[2]
)

// env is a complete receiver deployment in a temporary directory: an
// admission directory with a signed snapshot, a grant root, a config.
type env struct {
	t      testing.TB
	base   string
	config string
	cfg    map[string]any
	socket string
	grant  admission.Grant
	pub    *signedfile.Publisher
	dial   func(context.Context) (io.ReadWriteCloser, error) // how clients reach the daemon
	extra  []*os.File                                        // inherited by the daemon as fds 3...
}

func newEnv(t testing.TB, landlock, spawnMode string) *env {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		os.Chmod(d, 0o755)
	}
	e := &env{t: t, base: base, socket: filepath.Join(base, "run", "receiver.sock")}
	for _, d := range []string{"admission", "run", "root"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(base, "root")
	if err := os.Chown(root, int(gUID), int(gGID)); err != nil {
		t.Fatal(err)
	}
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := signing.WritePublicKey(filepath.Join(base, "admission.pub"), key.Public()); err != nil {
		t.Fatal(err)
	}
	if e.pub, err = signedfile.NewPublisher(signedfile.PublisherConfig{Dir: filepath.Join(base, "admission"), Key: key}); err != nil {
		t.Fatal(err)
	}
	e.grant = admission.Grant{
		Tuple: admission.Tuple{Owner: "o", Allocation: "a", Session: "s", Workspace: "w", Sandbox: "sb",
			Generation: 1, Executor: "e", Site: "site", Root: root},
		UID: gUID, GID: gGID, Groups: []uint32{gGroup},
		Ops:      []admission.Op{admission.OpRead, admission.OpWrite, admission.OpList, admission.OpExec, admission.OpKill},
		Limits:   admission.Limits{MaxProcs: 64, MaxRuntimeS: 600, MaxOutputBytes: 64 << 10, MaxFileBytes: 1 << 20},
		NotAfter: time.Now().Add(time.Hour),
	}
	if _, err := e.pub.Publish(context.Background(), admission.PublishInput{NotAfter: time.Now().Add(2 * time.Hour),
		Grants: []admission.Grant{e.grant}}); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"listen": []any{map[string]any{"kind": "unix", "path": e.socket, "host_only": true}},
		"admission": map[string]any{"file": filepath.Join(base, "admission", admission.FileName),
			"public_key": filepath.Join(base, "admission.pub"), "owner_uid": 0},
		"landlock": map[string]any{"mode": landlock},
		"spawn":    spawnMode,
	}
	e.cfg, e.config = cfg, filepath.Join(base, "receiver.json")
	e.dial = transport.Unix{Path: e.socket, HostOnly: true}.Dial
	e.writeConfig()
	return e
}

func (e *env) writeConfig() {
	data, _ := json.Marshal(e.cfg)
	if err := os.WriteFile(e.config, data, 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// daemon is a running tether-receiver process.
type daemon struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

// start runs the binary with the config and waits for its socket.
func (e *env) start(prefix ...string) *daemon {
	e.t.Helper()
	args := append(append([]string{}, prefix...), binary(e.t), "--config", e.config)
	d := &daemon{cmd: exec.Command(args[0], args[1:]...), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	d.cmd.ExtraFiles = e.extra
	if err := d.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	e.t.Cleanup(func() { d.cmd.Process.Kill(); <-d.done })
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if conn, err := e.dial(context.Background()); err == nil {
			conn.Close() // a unix socket exists between bind and listen; wait until it accepts
			return d
		}
		select {
		case err := <-d.done:
			d.done <- err
			e.t.Fatalf("daemon exited: %v\n%s", err, d.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	e.t.Fatalf("daemon did not listen within 15 s\n%s", d.stderr)
	return nil
}

// client dials the daemon's socket.
func (e *env) client() *client {
	e.t.Helper()
	conn, err := e.dial(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := wireclient.NewClient(conn, wireclient.ClientConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return &client{t: e.t, c: c, digest: e.grant.Tuple.SHA256()}
}

type client struct {
	t      testing.TB
	c      *wireclient.Client
	digest string
	seq    atomic.Int64
}

func (c *client) call(op wire.Op, args, result any) error {
	key := "k-" + strconv.FormatInt(c.seq.Add(1), 10)
	return c.c.Call(context.Background(), op, c.digest, key, time.Now().Add(30*time.Second), args, result)
}

// run starts argv and waits for it; it returns output and exit status.
func (c *client) run(argv ...string) (string, wire.ExitStatus) {
	c.t.Helper()
	var st wire.ExecStartResult
	if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: argv, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, &st); err != nil {
		c.t.Fatalf("exec_start %v: %v", argv, err)
	}
	var w wire.ExecWaitResult
	if err := c.call(wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID}, &w); err != nil {
		c.t.Fatal(err)
	}
	var out wire.ExecOutputResult
	if err := c.call(wire.OpExecOutput, wire.TerminalArgs{TerminalID: st.TerminalID}, &out); err != nil {
		c.t.Fatal(err)
	}
	if err := c.call(wire.OpExecRelease, wire.TerminalArgs{TerminalID: st.TerminalID}, nil); err != nil {
		c.t.Fatal(err)
	}
	return out.Output, w.Exit
}

// procsOfUID lists the processes of real uid u, zombies included.
func procsOfUID(t testing.TB, u uint32) []int { return scanUID(u, true) }

// liveProcsOfUID lists the processes of real uid u that have not exited.
// Once the receiver is gone, its dead children are init's to reap.
func liveProcsOfUID(t testing.TB, u uint32) []int { return scanUID(u, false) }

func scanUID(u uint32, zombies bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := caps.ReadStatus(fmt.Sprintf("/proc/%d/status", pid))
		if err == nil && st.UID[0] == u && (zombies || st.State != "Z") {
			out = append(out, pid)
		}
	}
	return out
}

func TestIntegrationCheckCaps(t *testing.T) {
	testenv.Require(t, "root")
	bin := binary(t)
	out, err := exec.Command(bin, "check-caps").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK: uid 0 with all seven capabilities") {
		t.Fatalf("check-caps as root: %v\n%s", err, out)
	}
	for _, c := range caps.Required {
		name := caps.Name(c)
		out, err := exec.Command(capsh(t), "--drop=cap_"+c.String(), "--", "-c", `exec "$0" check-caps`, bin).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitMissing {
			t.Fatalf("check-caps without %s: %v\n%s", name, err, out)
		}
		if !strings.Contains(string(out), name+" ") || !strings.Contains(string(out), "MISSING") || strings.Count(string(out), "MISSING") != 1 {
			t.Fatalf("check-caps without %s does not name exactly it:\n%s", name, out)
		}
	}
}

// TestIntegrationRefusesWithoutEachCap starts the daemon with each of the
// seven dropped from its bounding set: it refuses naming the capability,
// never listens, and (without KILL in particular) never starts a child.
func TestIntegrationRefusesWithoutEachCap(t *testing.T) {
	testenv.Require(t, "root")
	for _, c := range caps.Required {
		e := newEnv(t, "off", "thread")
		cmd := exec.Command(capsh(t), "--drop=cap_"+c.String(), "--", "-c", `exec "$0" --config "$1"`, binary(t), e.config)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitFailed || !strings.Contains(string(out), caps.Name(c)+" (not in") {
			t.Fatalf("daemon without %s: %v\n%s", caps.Name(c), err, out)
		}
		if _, err := os.Stat(e.socket); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("daemon without %s created its socket", caps.Name(c))
		}
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("processes of the grant uid exist: %v", ps)
	}
}

// TestIntegrationDaemon runs the real daemon and proves the masks of the
// receiver and of its children, before and after 100 commands.
func TestIntegrationDaemon(t *testing.T) {
	testenv.Require(t, "root")
	for _, mode := range []struct{ landlock, spawn, seccomp string }{{"required", "thread", "required"}, {"off", "helper", "off"},
		{"required", "clone", "required"}} {
		t.Run(mode.landlock+"-"+mode.spawn, func(t *testing.T) {
			e := newEnv(t, mode.landlock, mode.spawn)
			e.cfg["seccomp"] = map[string]any{"mode": mode.seccomp}
			e.writeConfig()
			d := e.start()
			assertReceiverThreads(t, d.cmd.Process.Pid)
			c := e.client()
			out, st := c.run("/bin/sh", "-c", "cat /proc/self/status; echo @@@; /bin/sh -c 'cat /proc/self/status'")
			if st.ExitCode == nil || *st.ExitCode != 0 {
				t.Fatalf("status %+v\n%s", st, out)
			}
			for i, part := range strings.Split(out, "@@@\n") {
				assertChild(t, []string{"child", "grandchild"}[i], part)
				assertSeccomp(t, []string{"child", "grandchild"}[i], part, mode.seccomp == "required")
			}
			for range 100 {
				if _, st := c.run("/bin/true"); st.ExitCode == nil || *st.ExitCode != 0 {
					t.Fatalf("true: %+v", st)
				}
			}
			assertReceiverThreads(t, d.cmd.Process.Pid)
			assertNoFilteredThread(t, d.cmd.Process.Pid)
			assertLandlock(t, e, c, mode.landlock == "required")
			var w wire.WriteResult
			if err := c.call(wire.OpWrite, wire.WriteArgs{Path: "f", Content: "x"}, &w); err != nil || w.Size != 1 {
				t.Fatalf("write: %+v %v", w, err)
			}
			d.cmd.Process.Signal(syscall.SIGTERM)
			if err := <-d.done; err != nil {
				t.Fatalf("daemon after SIGTERM: %v\n%s", err, d.stderr)
			}
			d.done <- nil
		})
	}
}

// assertSeccomp: a daemon's child runs under exactly one seccomp filter
// when seccomp is required (in thread mode forked from the request's own
// thread, which the filter then holds until the child is reaped), and
// under none when it is off.
func assertSeccomp(t *testing.T, who, status string, required bool) {
	t.Helper()
	want := "Seccomp:\t0\nSeccomp_filters:\t0\n"
	if required {
		want = "Seccomp:\t2\nSeccomp_filters:\t1\n"
	}
	if !strings.Contains(status, want) {
		t.Fatalf("%s: status lacks %q:\n%s", who, want, status)
	}
}

// assertNoFilteredThread: no thread of the receiver runs under a seccomp
// filter once the children are reaped (their spawning threads exit
// asynchronously: bounded for a slow guest).
func assertNoFilteredThread(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		if err != nil || len(tasks) == 0 {
			t.Fatalf("threads of %d: %v", pid, err)
		}
		var bad []string
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err == nil && !strings.Contains(string(b), "Seccomp:\t0\n") {
				bad = append(bad, f)
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver threads under a seccomp filter: %v", bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertLandlock: a daemon's child (forked, in thread mode, from the
// request's own thread) cannot read a world-readable file outside the
// grant root and the system directories when Landlock is required, and
// can when it is off, so the refusal is Landlock's, not the file's mode.
func assertLandlock(t *testing.T, e *env, c *client, required bool) {
	t.Helper()
	outside := filepath.Join(e.base, "outside.txt")
	if err := os.WriteFile(outside, []byte("outside the root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, st := c.run("/bin/cat", outside)
	read := st.ExitCode != nil && *st.ExitCode == 0 && out == "outside the root\n"
	switch {
	case required && (read || !strings.Contains(out, "Permission denied")):
		t.Fatalf("Landlock required: a child read %s outside its root: %+v %q", outside, st, out)
	case !required && !read:
		t.Fatalf("Landlock off: a child could not read the world-readable %s: %+v %q", outside, st, out)
	}
}

// assertReceiverThreads: every thread of the receiver holds exactly the
// seven capabilities (CapEff=CapPrm=CapBnd=00000000000001eb) and nothing
// else, and none has NoNewPrivs. A spawning thread exits asynchronously
// right after its child is reaped, so the check waits for the last ones
// (bounded for a slow guest).
func assertReceiverThreads(t *testing.T, pid int) {
	t.Helper()
	const want = "Eff=00000000000001eb Prm=00000000000001eb Bnd=00000000000001eb Inh=0000000000000000 Amb=0000000000000000 NNP=0 uid=[0 0 0 0]"
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts, err := caps.ThreadStatuses(pid)
		if err != nil || len(sts) == 0 {
			t.Fatalf("threads of %d: %v", pid, err)
		}
		var bad []string
		for tid, st := range sts {
			got := fmt.Sprintf("Eff=%016x Prm=%016x Bnd=%016x Inh=%016x Amb=%016x NNP=%d uid=%v",
				st.CapEff, st.CapPrm, st.CapBnd, st.CapInh, st.CapAmb, st.NoNewPrivs, st.UID)
			if got != want {
				bad = append(bad, fmt.Sprintf("thread %d: %s", tid, got))
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver threads:\n%s\nwant %s", strings.Join(bad, "\n"), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func assertChild(t *testing.T, who, status string) {
	t.Helper()
	st, err := caps.ParseStatus([]byte(status))
	if err != nil {
		t.Fatalf("%s: %v\n%s", who, err, status)
	}
	got := fmt.Sprintf("Uid=%v Gid=%v Groups=%v Inh=%016x Prm=%016x Eff=%016x Bnd=%016x Amb=%016x NNP=%d",
		st.UID, st.GID, st.Groups, st.CapInh, st.CapPrm, st.CapEff, st.CapBnd, st.CapAmb, st.NoNewPrivs)
	want := fmt.Sprintf("Uid=[%d %d %d %d] Gid=[%d %d %d %d] Groups=[%d] Inh=0000000000000000 Prm=0000000000000000 Eff=0000000000000000 Bnd=0000000000000000 Amb=0000000000000000 NNP=1",
		gUID, gUID, gUID, gUID, gGID, gGID, gGID, gGID, gGroup)
	if got != want {
		t.Fatalf("%s:\n got %s\nwant %s", who, got, want)
	}
}

// TestIntegrationSIGKILLKillsChildren: children die with the receiver.
func TestIntegrationSIGKILLKillsChildren(t *testing.T) {
	testenv.Require(t, "root")
	e := newEnv(t, "off", "thread")
	d := e.start()
	c := e.client()
	for range 3 {
		var st wire.ExecStartResult
		if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/sleep", "100"}}, &st); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(procsOfUID(t, gUID)); n != 3 {
		t.Fatalf("%d children running, want 3", n)
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	d.done <- nil
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for len(liveProcsOfUID(t, gUID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ps := liveProcsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("children %v survived SIGKILL of the receiver", ps)
	}
}

// BenchmarkExecRoundTrip measures exec_start + exec_wait of /bin/true
// through a wire client, the unix socket, the real daemon and its handler,
// against a direct fork/exec of /bin/true in the same run.
func BenchmarkExecRoundTrip(b *testing.B) {
	testenv.Require(b, "root")
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, mode := range []string{"thread", "helper"} {
		b.Run("receiver-"+mode, func(b *testing.B) {
			e := newEnv(b, "off", mode)
			e.start()
			c := e.client()
			for b.Loop() {
				var st wire.ExecStartResult
				if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}, &st); err != nil {
					b.Fatal(err)
				}
				var w wire.ExecWaitResult
				if err := c.call(wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID}, &w); err != nil {
					b.Fatal(err)
				}
				b.StopTimer() // releasing the finished terminal is bookkeeping, not the round trip
				if err := c.call(wire.OpExecRelease, wire.TerminalArgs{TerminalID: st.TerminalID}, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkStatRoundTrip isolates the wire, socket, grant lookup and
// handler cost of one request that starts nothing.
func BenchmarkStatRoundTrip(b *testing.B) {
	testenv.Require(b, "root")
	e := newEnv(b, "off", "thread")
	e.start()
	c := e.client()
	for b.Loop() {
		var st wire.StatResult
		if err := c.call(wire.OpStat, wire.StatArgs{Path: "."}, &st); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecRatio interleaves the two measurements of
// BenchmarkExecRoundTrip in every iteration, so load that drifts during the
// run (this machine is shared) affects both alike, and reports each mean
// and their ratio (the target is ≤ 1.3).
func BenchmarkExecRatio(b *testing.B) {
	testenv.Require(b, "root")
	for _, mode := range []string{"thread", "helper", "thread-cgroup", "clone-cgroup"} {
		b.Run(mode, func(b *testing.B) {
			spawnMode, withCgroup := strings.CutSuffix(mode, "-cgroup")
			e := newEnv(b, "off", spawnMode)
			if withCgroup { // each command in its own cgroup, created, drained and removed
				e.cfg["cgroup"] = map[string]any{"mode": "required", "parent": cgrouptest.Parent(b)}
				e.writeConfig()
			}
			e.start()
			c := e.client()
			var direct, recv time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := exec.Command("/bin/true").Run(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				var st wire.ExecStartResult
				if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}, &st); err != nil {
					b.Fatal(err)
				}
				var w wire.ExecWaitResult
				if err := c.call(wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID}, &w); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				direct, recv = direct+t1.Sub(t0), recv+t2.Sub(t1)
				b.StopTimer()
				if err := c.call(wire.OpExecRelease, wire.TerminalArgs{TerminalID: st.TerminalID}, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/op")
			b.ReportMetric(float64(recv.Nanoseconds())/float64(b.N), "receiver-ns/op")
			b.ReportMetric(float64(recv)/float64(direct), "ratio")
		})
	}
}

// BenchmarkExecPhases splits both sides of BenchmarkExecRatio/thread in
// two, interleaved in every iteration: a direct start (os/exec Start,
// which returns once the child has called execve) against exec_start's
// round trip, and a direct Wait against exec_wait's round trip. It shows
// where the receiver's cost lies: exec_wait goes out while the child still
// runs, so its round trip hides behind the child's own run time, and the
// overhead is all in exec_start (one round trip, grant and root checks,
// the thread's restriction).
func BenchmarkExecPhases(b *testing.B) {
	testenv.Require(b, "root")
	e := newEnv(b, "off", "thread")
	e.start()
	benchPhases(b, e.client())
}

// TestIntegrationTLSListener serves the daemon on TCP with mutual TLS from
// its config: a client with a certificate of the pinned CA works, one of
// another CA is refused before any request.
func TestIntegrationTLSListener(t *testing.T) {
	testenv.Require(t, "root")
	e := newEnv(t, "off", "thread")
	ca, err := pki.NewCA("tether test CA")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(e.base, "ca.pem")
	if err := ca.WriteCert(caFile); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := srv.WriteFiles(e.base, "receiver")
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	e.cfg["listen"] = []any{map[string]any{"kind": "tls", "address": addr, "ca_file": caFile,
		"cert_file": certFile, "key_file": keyFile}}
	e.writeConfig()
	e.dial = tlsDialer(t, ca, addr)
	e.start()
	c := e.client()
	if out, st := c.run("/bin/sh", "-c", "echo over tls"); out != "over tls\n" || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Fatalf("exec over TLS: %q %+v", out, st)
	}
	// A client that trusts the receiver but presents a certificate of
	// another CA must be refused by the receiver.
	other, err := pki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Client("stranger")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{stranger.TLSCertificate()}, MinVersion: tls.VersionTLS13})
	if err == nil {
		defer conn.Close()
		wc, _ := wireclient.NewClient(conn, wireclient.ClientConfig{})
		defer wc.Close()
		// TLS 1.3 reports a refused client certificate on the first read.
		if err := wc.Call(context.Background(), wire.OpAttach, e.grant.Tuple.SHA256(), "k", time.Now().Add(5*time.Second), nil, nil); err == nil {
			t.Fatal("a client certificate of another CA was served")
		}
	}
}

// tlsDialer dials addr with a client certificate issued by ca, trusting ca.
func tlsDialer(t *testing.T, ca *pki.CA, addr string) func(context.Context) (io.ReadWriteCloser, error) {
	t.Helper()
	cl, err := ca.Client("custodian")
	if err != nil {
		t.Fatal(err)
	}
	tr := transport.TLS{Address: addr, CA: ca.Cert, Certificate: cl.TLSCertificate(), ServerName: "127.0.0.1"}
	return tr.Dial
}

// freeAddr is a loopback address for the receiver to listen on, with a
// port below the kernel's ephemeral range (package ports).
func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", ports.Quiet(t))
}

// TestPrebuiltHookRefuses: the variable that replaces the build must name
// an executable regular file by absolute path; anything else fails the
// tests instead of quietly building (or running) something else.
func TestPrebuiltHookRefuses(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "exe"), filepath.Join(dir, "plain")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]string{"relative": "exe", "missing": filepath.Join(dir, "nope"),
		"directory": dir, "not executable": plain, "empty": ""} {
		if got, err := prebuilt(p); err == nil {
			t.Errorf("%s: prebuilt(%q) = %q, want an error", name, p, got)
		}
	}
	if got, err := prebuilt(exe); err != nil || got != exe {
		t.Fatalf("prebuilt(%q) = %q, %v", exe, got, err)
	}
}

// TestIntegrationCgroupRequired runs the daemon with cgroup containment
// required: a command's setsid escapee dies with the release and the
// command's cgroup is gone; on a parent that is not cgroup2 the daemon
// refuses to start, naming the check, and never listens.
func TestIntegrationCgroupRequired(t *testing.T) {
	testenv.Require(t, "root")
	e := newEnv(t, "off", "thread")
	e.cfg["cgroup"] = map[string]any{"mode": "required", "parent": e.base}
	e.writeConfig()
	out, err := exec.Command(binary(t), "--config", e.config).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailed || !strings.Contains(string(out), "check cgroup2 file system") {
		t.Fatalf("daemon with a tmpfs/plain cgroup parent: %v\n%s", err, out)
	}
	if _, err := os.Stat(e.socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a daemon that refused created its socket")
	}
	parent := cgrouptest.Parent(t)
	e.cfg["cgroup"] = map[string]any{"mode": "required", "parent": parent}
	e.writeConfig()
	e.start()
	c := e.client()
	out2, st := c.run("/bin/sh", "-c", `setsid sh -c 'touch escaped; exec sleep 100' & while [ ! -e escaped ]; do :; done; echo escaped`)
	if out2 != "escaped\n" || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Fatalf("escape command: %q %+v", out2, st)
	}
	deadline := time.Now().Add(10 * time.Second) // killed before exec_wait answered; only the reap is asynchronous
	for len(procsOfUID(t, gUID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("the escaped sleeper survived: %v", ps)
	}
	if ents, err := os.ReadDir(parent); err != nil || slices.ContainsFunc(ents, func(d os.DirEntry) bool { return d.IsDir() }) {
		t.Fatalf("command cgroups left in %s: %v %v", parent, ents, err)
	}
}

// TestIntegrationInheritedFdsNotPassedOn: descriptors the daemon inherits
// without close-on-exec (here a pipe and a file, as a launching shell or
// supervisor leaves them) never reach a command, in either spawn mode: a
// command's /proc/self/fd lists exactly 0, 1, 2 and the descriptor ls
// itself opens to list it.
func TestIntegrationInheritedFdsNotPassedOn(t *testing.T) {
	testenv.Require(t, "root")
	for _, mode := range []struct{ landlock, spawn string }{{"required", "thread"}, {"off", "helper"}, {"required", "clone"}} {
		t.Run(mode.landlock+"-"+mode.spawn, func(t *testing.T) {
			e := newEnv(t, mode.landlock, mode.spawn)
			rd, wr, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			defer wr.Close()
			f, err := os.Open(e.config)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			e.extra = []*os.File{wr, rd, f} // fds 3, 4 and 5 of the daemon, none close-on-exec
			e.start()
			out, st := e.client().run("/bin/ls", "-1", "/proc/self/fd")
			if st.ExitCode == nil || *st.ExitCode != 0 {
				t.Fatalf("ls: %+v\n%s", st, out)
			}
			if want := "0\n1\n2\n3\n"; out != want {
				t.Fatalf("the command's descriptors:\n%swant\n%s(3 is ls's own listing)", out, want)
			}
		})
	}
}
