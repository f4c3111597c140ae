package jail

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

func TestMain(m *testing.M) {
	HelperMain()
	if os.Getenv(envNoPriv) == "1" {
		os.Exit(noPrivMain())
	}
	if path := os.Getenv(envPayload); path != "" {
		os.Exit(payloadMain(path))
	}
	if p := os.Getenv(envAttack); p != "" {
		os.Exit(attackMain(p))
	}
	if p := os.Getenv(envNet); p != "" {
		os.Exit(netMain(p))
	}
	if code, ok := boundsMain(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// scene is the host the attacker is let loose on: canaries in /root,
// /home, /srv and /run, the computer's root with a secret, another
// computer, the custodian's state and key, and a tools directory the jail
// shows (with an executable that is not on the allowlist).
type scene struct {
	id                         string
	base, root, other, srvBase string
	rootCanary, homeCanary     string
	runCanary                  string
	state, key                 string
	tools, toolExe             string
	exe                        string // the test binary, copied where the agent's uid can reach it
}

func randHex(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func newScene(t testing.TB) *scene {
	t.Helper()
	id := randHex(t)
	s := &scene{id: id, base: "/var/lib/tether-jailtest-" + id, srvBase: "/srv/tether-jailtest-" + id}
	s.root, s.other = filepath.Join(s.srvBase, "w1"), filepath.Join(s.srvBase, "w2")
	s.rootCanary = "/root/.tether-jailtest-" + id
	s.homeCanary = "/home/tether-jailtest-" + id
	s.runCanary = "/run/tether-jailtest-" + id
	s.state, s.tools = filepath.Join(s.base, "state"), filepath.Join(s.base, "tools")
	s.key, s.toolExe = filepath.Join(s.state, "audit.key"), filepath.Join(s.tools, "prog")
	s.exe = filepath.Join(s.base, "bin", "jail.test")
	t.Cleanup(func() {
		for _, p := range []string{s.base, s.srvBase, s.rootCanary, s.homeCanary, s.runCanary} {
			os.RemoveAll(p)
		}
	})
	for _, d := range []string{s.root, s.other, s.state, s.tools, s.homeCanary, filepath.Dir(s.exe)} {
		mustDo(t, os.MkdirAll(d, 0o755))
	}
	mustDo(t, os.Chmod(s.state, 0o700))
	for _, f := range []string{filepath.Join(s.root, "secret.txt"), filepath.Join(s.other, "secret.txt"), s.key, s.rootCanary, s.runCanary} {
		mustDo(t, os.WriteFile(f, []byte("secret"), 0o600))
	}
	self, err := os.ReadFile("/proc/self/exe")
	mustDo(t, err)
	mustDo(t, os.WriteFile(s.exe, self, 0o755))
	mustDo(t, os.WriteFile(s.toolExe, self, 0o755))
	return s
}

func mustDo(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for the jail's stderr copy.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitContains reports whether the buffer holds sub, waiting for it up to
// 30 s. The jail's stderr reaches the buffer through a copying goroutine
// of its own, so what the agent wrote to stderr before it wrote its
// report to stdout may still be on its way when the report has arrived
// (seen once in 10 runs with two busy loops beside the test).
func (s *syncBuffer) waitContains(sub string) bool {
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.String(), sub) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// hostSleeper starts a process on the host as the agent's own uid (the
// worst case: same uid), whose command line carries a token.
func hostSleeper(t *testing.T, uid uint32) (*exec.Cmd, string) {
	t.Helper()
	token := "61." + strconv.Itoa(int(time.Now().UnixNano()%1e9))
	cmd := exec.Command("sleep", token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	mustDo(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, token
}

// listeners opens a host abstract unix socket and a loopback TCP port,
// accepting and closing whatever connects.
func listeners(t *testing.T, id string) (abstract, tcp string) {
	t.Helper()
	abstract = "tether-jailtest-" + id
	ul, err := net.Listen("unix", "@"+abstract)
	mustDo(t, err)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	mustDo(t, err)
	for _, l := range []net.Listener{ul, tl} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		t.Cleanup(func() { l.Close() })
	}
	return abstract, tl.Addr().String()
}

// startAttacker builds and starts a jail whose agent is the attacker,
// pinned to DefaultID unless cfg pins a uid (the attack tests run a host
// process as the agent's uid).
func startAttacker(t *testing.T, s *scene, cfg Config, p plan) (*Process, *syncBuffer) {
	t.Helper()
	if cfg.UID == nil {
		id := uint32(DefaultID)
		cfg.UID = &id
	}
	planJSON, err := json.Marshal(p)
	mustDo(t, err)
	spec, err := Build(Options{Config: cfg, Argv: []string{s.exe, "jail-attacker", p.Token}, Root: s.root,
		Env: append(os.Environ(), envAttack+"="+string(planJSON)), Hidden: []string{s.state, s.key}, Helper: s.exe})
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	if err != nil {
		t.Fatalf("start: %v\nstderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { proc.Kill(); proc.Stdin.Close(); proc.Stdout.Close(); proc.Wait() })
	return proc, stderr
}

// readReport reads the attacker's report, bounded by a minute.
func readReport(t *testing.T, proc *Process, stderr *syncBuffer) *report {
	t.Helper()
	type result struct {
		r   report
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r report
		err := json.NewDecoder(proc.Stdout).Decode(&r)
		ch <- result{r, err}
	}()
	select {
	case res := <-ch:
		if res.err != nil {
			proc.Kill()
			t.Fatalf("read the attacker's report: %v\nstderr:\n%s", res.err, stderr)
		}
		return &res.r
	case <-time.After(time.Minute):
		proc.Kill()
		t.Fatalf("no report within a minute\nstderr:\n%s", stderr)
	}
	return nil
}

// findPid returns the host pid of the process whose command line holds
// token (the attacker, seen from the host).
func findPid(t *testing.T, token string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	mustDo(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(data, []byte("jail-attacker\x00"+token)) {
			return pid
		}
	}
	t.Fatalf("no process with token %s", token)
	return 0
}

// statusOf reads /proc/PID/status into a map.
func statusOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	mustDo(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// TestIntegrationJailAttack runs an agent-like program in a jail with the
// default network and lets it attack the host, the computer and the
// custodian; every attempt must fail in the way the jail's control makes
// it fail.
func TestIntegrationJailAttack(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	sleeper, hostToken := hostSleeper(t, DefaultID)
	abstract, tcp := listeners(t, s.id)
	selfInterp, err := elfInterpOf(s.exe)
	mustDo(t, err)
	target, loader, extraExec := loaderTarget(t, s, selfInterp)
	p := plan{Token: "tok-" + s.id, HostPid: sleeper.Process.Pid, HostToken: hostToken, Abstract: abstract, TCP: tcp,
		ExecVisible: s.toolExe, Loader: loader, LoaderTarget: target,
		Stat: []string{s.rootCanary, s.homeCanary, s.runCanary, s.state, s.key, filepath.Join(s.root, "secret.txt"),
			filepath.Join(s.other, "secret.txt"), s.other, "/etc/shadow", "/etc/hostname", "/var/log", "/usr/bin/env"},
		List: []string{"/", "/root", "/home", "/srv", s.srvBase, "/run", s.root, "/usr/bin", "/var/lib", s.base},
		Write: []string{"/x", "/usr/lib/tether-jailtest-" + s.id, "/etc/x", "/dev/x", filepath.Join(s.root, "x"),
			filepath.Join(s.tools, "x"), Home + "/w", Tmp + "/w"},
	}
	proc, stderr := startAttacker(t, s, Config{Read: []string{s.tools}, Exec: extraExec}, p)
	r := readReport(t, proc, stderr)
	pid := findPid(t, p.Token)
	checkMasks(t, statusOf(t, pid), r.Status)
	checkHidden(t, s, r)
	checkWrites(t, s, r)
	checkExec(t, r, stderr)
	if r.SelfInterp != selfInterp {
		t.Errorf("the attacker's PT_INTERP inside the jail %q, on the host %q: the test chose its loader target from the wrong kind", r.SelfInterp, selfInterp)
	}
	checkProcesses(t, r)
	if r.Abstract != "EPERM" {
		t.Errorf("connect to the host's abstract socket @%s: %s, want EPERM (Landlock's abstract unix socket scope)", abstract, r.Abstract)
	}
	if r.TCP != "ok" {
		t.Errorf("network host: connect to the host's loopback %s: %s, want ok (documented: network host reaches loopback)", tcp, r.TCP)
	}
	checkEmptiedAfter(t, proc, pid, r.Markers)
	const banner = "tether jail: the agent runs confined: uid 59999 gid 59999"
	if !stderr.waitContains(banner) || !strings.HasPrefix(stderr.String(), banner) {
		t.Errorf("the jail's start-up line is missing from the agent's stderr:\n%s", stderr)
	}
}

// loaderTarget chooses the dynamic program for the loader attack, by the
// ELF kind of the test binary (the agent): if it is dynamic (built with
// cgo), the agent itself, whose loader the jail allows because the agent
// needs it; if it is static (CGO_ENABLED=0), the jail would hold no
// loader at all, so the test allows a dynamic program as jail.exec would
// (a copy of the host's touch in the scene, checked to have a PT_INTERP),
// which brings its loader into the allowlist. It returns the target's
// path, its loader, and the Config.Exec that allows it.
func loaderTarget(t *testing.T, s *scene, selfInterp string) (target, loader string, allow []string) {
	t.Helper()
	if selfInterp != "" {
		return s.exe, selfInterp, nil
	}
	touch, err := exec.LookPath("touch")
	mustDo(t, err)
	interp, err := elfInterpOf(touch)
	mustDo(t, err)
	if interp == "" {
		t.Fatalf("the test binary is static and so is %s: no dynamic program to attack the loader with", touch)
	}
	data, err := os.ReadFile(touch)
	mustDo(t, err)
	target = filepath.Join(filepath.Dir(s.exe), "dynamic-touch")
	mustDo(t, os.WriteFile(target, data, 0o755))
	return target, interp, []string{target}
}

// checkMasks asserts the agent's ids, capabilities and no_new_privs, seen
// from the host and from inside.
func checkMasks(t *testing.T, host, inside map[string]string) {
	t.Helper()
	want := map[string]string{"Uid": "59999\t59999\t59999\t59999", "Gid": "59999\t59999\t59999\t59999", "Groups": "",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1"}
	for k, v := range want {
		if host[k] != v {
			t.Errorf("host view of the agent: %s = %q, want %q", k, host[k], v)
		}
		if k != "Groups" && inside[k] != v {
			t.Errorf("agent's own view: %s = %q, want %q", k, inside[k], v)
		}
	}
	if !strings.Contains(host["NSpid"], "\t") {
		t.Errorf("NSpid %q: the agent is not in a pid namespace of its own", host["NSpid"])
	}
}

// checkHidden asserts that nothing of the host, the computer or the
// custodian is visible, and that the cwd is an empty placeholder.
func checkHidden(t *testing.T, s *scene, r *report) {
	t.Helper()
	for path, got := range r.Stat {
		want := "ENOENT"
		if got != want {
			t.Errorf("stat %s inside the jail: %s, want %s (not visible at all)", path, got, want)
		}
	}
	wantList := map[string][]string{
		"/root": nil, "/run": nil, "/home": {"agent"}, "/srv": {filepath.Base(s.srvBase)},
		s.srvBase: {"w1"}, s.root: {}, "/var/lib": {filepath.Base(s.base)}, s.base: {"bin", "tools"},
	}
	for dir, want := range wantList {
		if want == nil {
			if r.ListErr[dir] == "ok" {
				t.Errorf("list %s: %v, want an error (not visible, or not traceable)", dir, r.List[dir])
			}
			continue
		}
		if r.ListErr[dir] != "ok" || !slices.Equal(r.List[dir], want) {
			t.Errorf("list %s: %v (%s), want exactly %v", dir, r.List[dir], r.ListErr[dir], want)
		}
	}
	if r.Cwd != s.root {
		t.Errorf("cwd %q, want the tuple root's path %s (as a placeholder)", r.Cwd, s.root)
	}
	if bin := r.List["/usr/bin"]; slices.Contains(bin, "env") || slices.Contains(bin, "cat") || len(bin) > 4 {
		t.Errorf("/usr/bin shows %v, want only the shell stubs", bin)
	}
}

// checkWrites asserts that only HOME and /tmp are writable and that no
// refused write reached the host.
func checkWrites(t *testing.T, s *scene, r *report) {
	t.Helper()
	for path, got := range r.Write {
		want := "EROFS"
		switch {
		case path == Home+"/w" || path == Tmp+"/w":
			want = "ok"
		case path == "/dev/x":
			want = "EROFS"
		}
		if got != want {
			t.Errorf("write %s: %s, want %s", path, got, want)
		}
	}
	for _, host := range []string{filepath.Join(s.root, "x"), filepath.Join(s.tools, "x"), "/usr/lib/tether-jailtest-" + s.id, "/x"} {
		if _, err := os.Lstat(host); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("host %s exists after the jail's refused write (%v)", host, err)
		}
	}
}

// checkExec asserts that the shell stub refused (naming the jail, in the
// agent's stderr too), that copies written to HOME and /tmp cannot run,
// not even through the dynamic loader (which itself runs, and runs the
// allowed program: the positive control), and that a visible program off
// the allowlist cannot run.
func checkExec(t *testing.T, r *report, stderr *syncBuffer) {
	t.Helper()
	if r.ShellExit != StubExit || r.ShellPwned || !strings.Contains(r.ShellStderr, "tether jail: refused to run /usr/bin/sh -c echo pwned") {
		t.Errorf("/bin/sh: exit %d, pwned %v, stderr %q; want exit %d from the jail's stub naming the jail", r.ShellExit, r.ShellPwned, r.ShellStderr, StubExit)
	}
	if !stderr.waitContains("tether jail: refused to run /usr/bin/sh") {
		t.Errorf("the stub's refusal is missing from the jail's stderr:\n%s", stderr)
	}
	for what, got := range map[string]string{"exec of a copy in HOME": r.ExecHome, "exec of a copy in /tmp": r.ExecTmp,
		"exec of a visible program off the allowlist": r.ExecVisible} {
		if got != "EACCES" {
			t.Errorf("%s: %s, want EACCES", what, got)
		}
	}
	if r.LoaderDirect != "ok" || !r.DirectRan {
		t.Errorf("the loader on the allowed dynamic program: %s, ran %v; want ok (else the /tmp case proves nothing)", r.LoaderDirect, r.DirectRan)
	}
	if r.LoaderTmp != "exit 127" || r.PayloadRan {
		t.Errorf("the dynamic loader on a copy in /tmp: %s, payload ran %v; want the loader's own failure, exit 127 (noexec: it cannot map the copy)", r.LoaderTmp, r.PayloadRan)
	}
}

// checkProcesses asserts that host processes are invisible and the
// jail's own pid 1 is out of reach.
func checkProcesses(t *testing.T, r *report) {
	t.Helper()
	for what, c := range map[string][2]string{
		"kill(host pid, 0)":      {r.KillHost, "ESRCH"},
		"ptrace attach host pid": {r.PtraceHost, "ESRCH"},
		"read /proc/<host pid>":  {r.ProcHost, "ENOENT"},
		"kill(1, 0)":             {r.KillInit, "EPERM"},
		"ptrace attach 1":        {r.PtraceInit, "EPERM"},
	} {
		if c[0] != c[1] {
			t.Errorf("%s: %s, want %s", what, c[0], c[1])
		}
	}
	if len(r.InitFds) == 0 {
		t.Error("the jail's pid 1 shows no descriptors: the check did not run")
	}
	for fd, got := range r.InitFds {
		if got != "EACCES" {
			t.Errorf("open /proc/1/fd/%s (the jail's pid 1, outside the agent's Landlock domain): %s, want EACCES", fd, got)
		}
	}
	if r.HostInProc {
		t.Error("a host process is visible in the jail's /proc")
	}
}

// checkEmptiedAfter holds HOME and /tmp open from the host while the agent
// runs, ends the agent, and asserts both were emptied and the scratch
// directory removed.
func checkEmptiedAfter(t *testing.T, proc *Process, pid int, markers []string) {
	t.Helper()
	if len(markers) != 2 {
		t.Errorf("the attacker left markers %v, want one in HOME and one in /tmp", markers)
	}
	var dirs []*os.File
	for _, d := range []string{Home, Tmp} {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "root", d))
		mustDo(t, err)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		mustDo(t, err)
		if !slices.Contains(names, "marker-"+strings.TrimPrefix(filepath.Base(markers[0]), "marker-")) {
			t.Errorf("%s before the end: %v, want the marker", d, names)
		}
		dirs = append(dirs, f)
	}
	proc.Stdin.Close()
	if err := proc.Wait(); err != nil {
		t.Errorf("wait: %v", err)
	}
	for _, f := range dirs {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		names, err := f.Readdirnames(-1)
		if err != nil || len(names) != 0 {
			t.Errorf("%s after the end: %v (%v), want empty", f.Name(), names, err)
		}
	}
	if _, err := os.Stat(proc.scratch); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch directory %s still exists (%v)", proc.scratch, err)
	}
}

// TestIntegrationJailNetworkNone: with network none the agent has its own
// network namespace, so the host's loopback services are out of reach.
func TestIntegrationJailNetworkNone(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	sleeper, hostToken := hostSleeper(t, DefaultID)
	abstract, tcp := listeners(t, s.id)
	p := plan{Token: "tok-" + s.id, HostPid: sleeper.Process.Pid, HostToken: hostToken, Abstract: abstract, TCP: tcp}
	proc, stderr := startAttacker(t, s, Config{Network: NetworkNone}, p)
	r := readReport(t, proc, stderr)
	if r.TCP != "ECONNREFUSED" {
		t.Errorf("network none: connect to the host's loopback %s: %s, want ECONNREFUSED (the jail's own loopback)", tcp, r.TCP)
	}
	if r.Abstract != "ECONNREFUSED" && r.Abstract != "EPERM" {
		t.Errorf("network none: connect to the host's abstract socket: %s, want a refusal", r.Abstract)
	}
	proc.Stdin.Close()
	if err := proc.Wait(); err != nil {
		t.Errorf("wait: %v", err)
	}
}

// TestIntegrationJailNode runs the real runtime agents use, node, in the
// jail: it starts (its dynamic loader and libraries are visible), and its
// own attempts to read the host and to run a shell fail, naming the jail.
func TestIntegrationJailNode(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "node")
	s := newScene(t)
	script := `const fs=require('fs'), cp=require('child_process'), os=require('os');
const o={uid: process.getuid(), home: os.homedir(), cwd: process.cwd()};
for (const p of ['/root', '/srv/` + filepath.Base(s.srvBase) + `/w2', '` + s.state + `']) { try { fs.readdirSync(p); o[p]='ok' } catch (e) { o[p]=e.code } }
o.cwd_list = fs.readdirSync('.');
try { fs.writeFileSync('x', 'x'); o.cwd_write='ok' } catch (e) { o.cwd_write=e.code }
fs.writeFileSync(os.homedir()+'/h', 'x');
const sh = cp.spawnSync('/bin/sh', ['-c', 'id'], {encoding: 'utf8'}); o.sh_status = sh.status; o.sh_stderr = sh.stderr;
const ls = cp.spawnSync('ls', {encoding: 'utf8'}); o.ls = ls.error ? ls.error.code : ls.status;
console.log(JSON.stringify(o));`
	spec, err := Build(Options{Argv: []string{"node", "-e", script}, Root: s.root, Env: os.Environ(),
		Hidden: []string{s.state, s.key}, Helper: s.exe})
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	mustDo(t, err)
	proc.Stdin.Close()
	out, _ := io.ReadAll(proc.Stdout)
	proc.Stdout.Close()
	if err := proc.Wait(); err != nil {
		t.Fatalf("node in the jail: %v\nstdout: %s\nstderr:\n%s", err, out, stderr)
	}
	var o map[string]any
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("node's report %q: %v\nstderr:\n%s", out, err, stderr)
	}
	if uid, _ := o["uid"].(float64); uid != float64(proc.spec.UID) || uid < DefaultUIDFirst || uid > DefaultUIDLast {
		t.Errorf("node: uid %v, want the jail's own %d, drawn from %d-%d", o["uid"], proc.spec.UID, DefaultUIDFirst, DefaultUIDLast)
	}
	want := map[string]any{"home": Home, "cwd": s.root, "/root": "ENOENT",
		"/srv/" + filepath.Base(s.srvBase) + "/w2": "ENOENT", s.state: "ENOENT", "cwd_write": "EROFS",
		"sh_status": float64(StubExit), "ls": "ENOENT"}
	for k, v := range want {
		if o[k] != v {
			t.Errorf("node: %s = %v, want %v", k, o[k], v)
		}
	}
	if l, _ := o["cwd_list"].([]any); len(l) != 0 {
		t.Errorf("node: the cwd lists %v, want an empty placeholder", l)
	}
	if sh, _ := o["sh_stderr"].(string); !strings.HasPrefix(sh, "tether jail: refused to run /usr/bin/sh -c id") {
		t.Errorf("node: the shell's stderr %q does not name the jail", sh)
	}
}
