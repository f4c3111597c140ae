package jail

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// DefaultID is the uid the attack tests pin (jail.uid): every jail's
// uid before each drew its own. hostSleeper runs a host process as it,
// the worst case of a neighbour with the agent's uid.
const DefaultID = 59999

// More roles of the test binary (TestMain dispatches through boundsMain).
const (
	envHold      = "TETHER_JAIL_TEST_HOLD"      // an agent that holds until stdin closes
	envCustodian = "TETHER_JAIL_TEST_CUSTODIAN" // JSON custodianPlan: start a jail, print its scratch directory, wait
	envHog       = "TETHER_JAIL_TEST_HOG"       // MiB to allocate and touch, then say so and hold
	envForks     = "TETHER_JAIL_TEST_FORKS"     // children to fork (each exits at once), then report and hold
	envServe     = "TETHER_JAIL_TEST_SERVE"     // a host TCP address: try to serve on the host, connect to it, report and hold
	envNoCgroup  = "TETHER_JAIL_TEST_NOCGROUP"  // in a mount namespace of its own: check the cgroup before and after unmounting every cgroup file system
)

// custodianPlan is what a helper custodian (a child the test SIGKILLs)
// starts.
type custodianPlan struct {
	Exe, Root, ScratchParent string
}

// boundsMain runs the test binary's roles added for the jail's bounds.
func boundsMain() (int, bool) {
	if n, err := strconv.Atoi(os.Getenv(envHog)); err == nil {
		return hogMain(n), true
	}
	if n, err := strconv.Atoi(os.Getenv(envForks)); err == nil {
		return forksMain(n), true
	}
	if os.Getenv(envNoCgroup) == "1" {
		return noCgroupMain(), true
	}
	if addr := os.Getenv(envServe); addr != "" {
		return serveMain(addr), true
	}
	if os.Getenv(envHold) == "1" {
		fmt.Println("holding")
		io.Copy(io.Discard, os.Stdin)
		return 0, true
	}
	if plan := os.Getenv(envCustodian); plan != "" {
		return custodianMain(plan), true
	}
	return 0, false
}

// custodianMain starts a jail that holds, prints its scratch directory
// and waits to be killed.
func custodianMain(planJSON string) int {
	var p custodianPlan
	if err := json.Unmarshal([]byte(planJSON), &p); err != nil {
		fmt.Fprintln(os.Stderr, "custodian: plan:", err)
		return 2
	}
	spec, err := Build(Options{Argv: []string{p.Exe, "jail-hold"}, Root: p.Root, Env: holdEnv(), Helper: p.Exe, ScratchParent: p.ScratchParent})
	if err != nil {
		fmt.Fprintln(os.Stderr, "custodian: build:", err)
		return 2
	}
	proc, err := Start(spec, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "custodian: start:", err)
		return 2
	}
	line, err := bufio.NewReader(proc.Stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		fmt.Fprintf(os.Stderr, "custodian: the agent said %q, %v\n", line, err)
		return 2
	}
	fmt.Println(strings.Join(append([]string{proc.scratch}, cgroupDirs(proc)...), " "))
	select {}
}

// hogMain allocates and touches mib MiB, says so, and holds.
func hogMain(mib int) int {
	var keep [][]byte
	for range mib {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
	}
	fmt.Printf("allocated %d MiB\n", len(keep))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// forkReport is what forksMain saw.
type forkReport struct {
	Forked int    `json:"forked"`
	Err    string `json:"err"`
}

// forksMain forks n children that exit at once (and stay unreaped, so
// each keeps its pid), reports how many it got, and holds.
func forksMain(n int) int {
	r := forkReport{Err: "ok"}
	for r.Forked < n {
		pid, _, errno := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if errno != 0 {
			r.Err = errName(errno)
			break
		}
		if pid == 0 {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0) // the child touches nothing of the runtime
		}
		r.Forked++
	}
	json.NewEncoder(os.Stdout).Encode(r)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// noCgroupMain runs in a mount namespace of its own: the jail's cgroup
// check passes, then, with /sys/fs/cgroup detached (so mountinfo lists no
// cgroup file system), it fails naming both checks and the opt-out, and
// passes with jail.cgroup off. It prints "nocgroup: ok" only then.
func noCgroupMain() int {
	required, off := &Spec{Cgroup: CgroupRequired}, &Spec{Cgroup: CgroupOff}
	if err := checkCgroup(required); err != nil {
		fmt.Println("nocgroup: positive control: the check fails with the cgroups mounted:", err)
		return 1
	}
	if err := unix.Unmount("/sys/fs/cgroup", unix.MNT_DETACH); err != nil {
		fmt.Println("nocgroup: detach /sys/fs/cgroup:", err)
		return 1
	}
	err := checkCgroup(required)
	if !errors.Is(err, ErrCgroup) || !strings.Contains(err.Error(), "cgroup2 (") || !strings.Contains(err.Error(), "cgroup v1 (") ||
		!strings.Contains(err.Error(), "--jail-cgroup off") {
		fmt.Println("nocgroup: without cgroups:", err, "; want ErrCgroup naming both checks and the opt-out")
		return 1
	}
	if err := checkCgroup(off); err != nil {
		fmt.Println("nocgroup: with jail.cgroup off:", err)
		return 1
	}
	fmt.Println("nocgroup: ok")
	return 0
}

// TestIntegrationJailRefusesWithoutCgroup: on a machine with no cgroup
// that can hold the limits (a mount namespace with /sys/fs/cgroup
// detached) the jail's check fails (ErrCgroup) naming the cgroup2 and v1
// checks and the opt-out, and passes with jail.cgroup off. Positive
// control: in the same process, before the detach, it passes.
func TestIntegrationJailRefusesWithoutCgroup(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits")
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), envNoCgroup+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // mounts made private by os/exec
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nocgroup: ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// serveReport is what serveMain saw: an errno name or "ok" for each way
// to serve, the ports it listens on, and its connect to the host.
type serveReport struct {
	Bind    string `json:"bind"`    // bind 127.0.0.1:0, then listen
	Listen  string `json:"listen"`  // listen without bind (the kernel binds a port)
	MPTCP   string `json:"mptcp"`   // a Multipath TCP socket: bind, then listen
	IOUring string `json:"iouring"` // io_uring_setup
	Connect string `json:"connect"` // connect to the host's loopback listener
	Unix    string `json:"unix"`    // listen on a unix socket in the jail's /tmp (go-plugin's way)
	Ports   []int  `json:"ports"`
}

// serveMain tries every way to serve TCP on the host's loopback, keeps
// what listens open, reports, and holds.
func serveMain(hostAddr string) int {
	var r serveReport
	listen := func(proto int, bind bool) string {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, proto)
		if err != nil {
			return errName(err)
		}
		if bind {
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
				return errName(err)
			}
		}
		if err := unix.Listen(fd, 8); err != nil {
			return errName(err)
		}
		if sa, err := unix.Getsockname(fd); err == nil {
			r.Ports = append(r.Ports, sa.(*unix.SockaddrInet4).Port)
		}
		return "ok" // fd stays open: it serves until the jail ends
	}
	r.Bind, r.Listen, r.MPTCP = listen(unix.IPPROTO_TCP, true), listen(unix.IPPROTO_TCP, false), listen(ipprotoMPTCP, true)
	var params [120]byte // struct io_uring_params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	r.IOUring = errName(nil)
	if errno != 0 {
		r.IOUring = errName(errno)
	} else {
		unix.Close(int(fd))
	}
	c, err := net.DialTimeout("tcp", hostAddr, 5*time.Second)
	if c != nil {
		c.Close()
	}
	r.Connect = errName(err)
	r.Unix = errName(nil)
	if l, err := net.Listen("unix", filepath.Join(os.TempDir(), "serve.sock")); err != nil {
		r.Unix = errName(err)
	} else {
		defer l.Close()
	}
	json.NewEncoder(os.Stdout).Encode(r)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestIntegrationJailNoServe: under network host the agent cannot serve
// TCP on the host: bind fails (Landlock, EACCES), and listen on an
// unbound socket, a Multipath TCP socket and io_uring fail (seccomp,
// EPERM), while its connect to the host's loopback still works. Positive
// control: without the bind rule and the filter it listens three ways
// and a host client connects to each.
func TestIntegrationJailNoServe(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	_, tcp := listeners(t, s.id)
	proc, stderr, out := startRole(t, s, Config{}, envServe, tcp)
	var r serveReport
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		t.Fatalf("the agent's report: %v\nstderr:\n%s", err, stderr)
	}
	want := serveReport{Bind: "EACCES", Listen: "EPERM", MPTCP: "EPERM", IOUring: "EPERM", Connect: "ok", Unix: "EPERM"}
	if r.Bind != want.Bind || r.Listen != want.Listen || r.MPTCP != want.MPTCP || r.IOUring != want.IOUring ||
		r.Connect != want.Connect || r.Unix != want.Unix || len(r.Ports) != 0 {
		t.Errorf("network host: %+v, want %+v", r, want)
	}
	proc.Stdin.Close()
	mustDo(t, proc.Wait())

	// A tether agent (Options.Listen): its plugin's unix socket listens;
	// bind, Multipath TCP and io_uring stay refused.
	listenOpt = true
	proc, stderr, out = startRole(t, s, Config{}, envServe, tcp)
	listenOpt = false
	r = serveReport{}
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		t.Fatalf("with Listen: the agent's report: %v\nstderr:\n%s", err, stderr)
	}
	if r.Bind != "EACCES" || r.MPTCP != "EPERM" || r.IOUring != "EPERM" || r.Connect != "ok" || r.Unix != "ok" || r.Listen != "ok" {
		t.Errorf("network host with Listen: %+v; want bind EACCES, mptcp and iouring EPERM, connect, unix and listen ok", r)
	}
	proc.Stdin.Close()
	mustDo(t, proc.Wait())

	skipServeBounds = true
	proc, stderr, out = startRole(t, s, Config{}, envServe, tcp)
	skipServeBounds = false
	r = serveReport{}
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		t.Fatalf("positive control: the agent's report: %v\nstderr:\n%s", err, stderr)
	}
	want = serveReport{Bind: "ok", Listen: "ok", MPTCP: r.MPTCP, IOUring: r.IOUring, Connect: "ok"}
	if hostHas("/proc/sys/net/mptcp/enabled", "1") {
		want.MPTCP = "ok"
	}
	if hostHas("/proc/sys/kernel/io_uring_disabled", "0") {
		want.IOUring = "ok"
	}
	if r.Bind != want.Bind || r.Listen != want.Listen || r.MPTCP != want.MPTCP || r.IOUring != want.IOUring || r.Connect != want.Connect {
		t.Errorf("positive control (no bind rule, no filter): %+v, want %+v", r, want)
	}
	if len(r.Ports) < 2 {
		t.Errorf("positive control: the agent listens on %v, want at least two ports", r.Ports)
	}
	for _, port := range r.Ports {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			t.Errorf("positive control: a host client cannot connect to the agent's port %d: %v", port, err)
			continue
		}
		c.Close()
	}
}

// listenOpt is the Options.Listen of the next startRole.
var listenOpt bool

// hostHas reports whether the file (a sysctl) holds value.
func hostHas(path, value string) bool {
	data, err := os.ReadFile(path)
	return err == nil && strings.TrimSpace(string(data)) == value
}

// holdEnv is the environment of an agent that holds, or plays role
// (envHog or envForks) with value.
func holdEnv(role ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != envCustodian && name != envAttack && name != envHog && name != envForks && name != envServe {
			env = append(env, kv)
		}
	}
	if len(role) == 2 {
		return append(env, role[0]+"="+role[1])
	}
	return append(env, envHold+"=1")
}

// cgroupDirs are the directories of the jail's cgroup.
func cgroupDirs(p *Process) []string {
	switch {
	case p.cg == nil:
		return nil
	case p.cg.v2 != "":
		return []string{p.cg.v2}
	}
	return p.cg.v1
}

// startRole starts a jail whose agent plays role (envHog, envForks).
func startRole(t *testing.T, s *scene, cfg Config, role, value string) (*Process, *syncBuffer, *bufio.Reader) {
	t.Helper()
	spec, err := Build(Options{Config: cfg, Argv: []string{s.exe, "jail-" + role}, Root: s.root, Env: holdEnv(role, value), Helper: s.exe,
		Listen: listenOpt})
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	if err != nil {
		t.Fatalf("start: %v\nstderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { proc.Kill(); proc.Stdin.Close(); proc.Stdout.Close(); proc.Wait() })
	return proc, stderr, bufio.NewReader(proc.Stdout)
}

// TestIntegrationJailMemoryLimit: an agent that allocates 512 MiB in a
// jail limited to 128 MiB is killed before it gets them. Positive
// control: with jail.cgroup off the same agent allocates all 512 MiB.
func TestIntegrationJailMemoryLimit(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "cgroup-limits")
	s := newScene(t)
	limit := int64(128 << 20)
	proc, stderr, out := startRole(t, s, Config{MaxMemoryBytes: &limit}, envHog, "512")
	if line, err := out.ReadString('\n'); err == nil {
		t.Errorf("limited to 128 MiB, the agent said %q; want it killed before it allocates 512 MiB", line)
	}
	var ee *exec.ExitError
	if err := proc.Wait(); !errors.As(err, &ee) {
		t.Errorf("limited to 128 MiB: wait %v, want the agent's failure", err)
	}
	if !strings.Contains(stderr.String(), ": memory 134217728 bytes, no swap; pids 512; RLIMIT_NPROC 512") {
		t.Errorf("the start-up line does not state the cgroup and its limits:\n%s", stderr)
	}
	proc, stderr, out = startRole(t, s, Config{Cgroup: CgroupOff, MaxMemoryBytes: &limit}, envHog, "512")
	if line, err := out.ReadString('\n'); line != "allocated 512 MiB\n" {
		t.Errorf("positive control (jail.cgroup off): the agent said %q, %v; want all 512 MiB\nstderr:\n%s", line, err, stderr)
	}
	if !strings.Contains(stderr.String(), "no cgroup (jail.cgroup \"off\", the operator's opt-out): memory unbounded") {
		t.Errorf("the start-up line does not state the opt-out:\n%s", stderr)
	}
	proc.Stdin.Close()
	mustDo(t, proc.Wait())
}

// TestIntegrationJailPidsLimit: a fork loop of 200 in a jail with
// max_pids 64 stops with EAGAIN below 64, and the host sees at most 64
// tasks in the jail's cgroup; with the cgroup off RLIMIT_NPROC of the
// jail's own uid still stops it. Positive control: cgroup off and
// max_pids 4096, all 200 forks succeed.
func TestIntegrationJailPidsLimit(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "cgroup-limits")
	s := newScene(t)
	small, large := int64(64), int64(4096)
	for _, c := range []struct {
		name   string
		cfg    Config
		capped bool
	}{
		{"cgroup pids.max 64", Config{MaxPids: &small}, true},
		{"cgroup off, RLIMIT_NPROC 64", Config{MaxPids: &small, Cgroup: CgroupOff}, true},
		{"positive control: cgroup off, max_pids 4096", Config{MaxPids: &large, Cgroup: CgroupOff}, false},
	} {
		proc, stderr, out := startRole(t, s, c.cfg, envForks, "200")
		var r forkReport
		if err := json.NewDecoder(out).Decode(&r); err != nil {
			t.Fatalf("%s: the fork loop's report: %v\nstderr:\n%s", c.name, err, stderr)
		}
		t.Logf("%s: forked %d, then %s", c.name, r.Forked, r.Err)
		if c.capped && (r.Forked >= int(small) || r.Err != "EAGAIN") {
			t.Errorf("%s: forked %d, %s; want fewer than %d, then EAGAIN", c.name, r.Forked, r.Err, small)
		}
		if !c.capped && (r.Forked != 200 || r.Err != "ok") {
			t.Errorf("%s: forked %d, %s; want all 200", c.name, r.Forked, r.Err)
		}
		for _, d := range cgroupDirs(proc) {
			if data, err := os.ReadFile(filepath.Join(d, "pids.current")); err == nil {
				if n, _ := strconv.Atoi(strings.TrimSpace(string(data))); n > int(small) || n <= r.Forked {
					t.Errorf("%s: the jail's cgroup holds %d tasks; want more than the %d children, at most %d", c.name, n, r.Forked, small)
				}
			}
		}
		proc.Stdin.Close()
		mustDo(t, proc.Wait())
	}
}

// startHolder starts a jail whose agent holds until its stdin closes,
// and waits until it runs.
func startHolder(t *testing.T, s *scene, o Options) (*Process, *syncBuffer) {
	t.Helper()
	o.Argv, o.Root, o.Env, o.Helper = []string{s.exe, "jail-hold"}, s.root, holdEnv(), s.exe
	spec, err := Build(o)
	mustDo(t, err)
	stderr := &syncBuffer{}
	proc, err := Start(spec, stderr)
	if err != nil {
		t.Fatalf("start: %v\nstderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { proc.Kill(); proc.Stdin.Close(); proc.Stdout.Close(); proc.Wait() })
	line, err := bufio.NewReader(proc.Stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("the holding agent said %q, %v\nstderr:\n%s", line, err, stderr)
	}
	return proc, stderr
}

// agentUID reads the real, effective, saved and file system uid of the
// jail's agent from the host (the holder is bwrap's grandchild).
func agentUID(t *testing.T, proc *Process) string {
	t.Helper()
	leader, err := sessionLeader(proc.Pid())
	mustDo(t, err)
	ents, err := os.ReadDir("/proc")
	mustDo(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, err := parentAndGroup(pid); err == nil && ppid == leader {
			return statusOf(t, pid)["Uid"]
		}
	}
	t.Fatalf("no agent below the jail's pid 1 (%d)", leader)
	return ""
}

// TestIntegrationJailOwnUID: two jails running at once each have a uid of
// their own, drawn from the range, that the agent runs as and the scratch
// directory is named for. Positive control: a pinned jail.uid is what the
// agent runs as (the uid is the configuration's, not a constant), and a
// second jail pinned to it is refused while the first runs (ErrUID), so
// no two live jails ever share a uid.
func TestIntegrationJailOwnUID(t *testing.T) {
	testenv.Require(t, "root", "bwrap")
	s := newScene(t)
	a, _ := startHolder(t, s, Options{})
	b, _ := startHolder(t, s, Options{})
	ua, ub := agentUID(t, a), agentUID(t, b)
	for _, c := range []struct {
		proc *Process
		uid  string
	}{{a, ua}, {b, ub}} {
		id := c.proc.spec.UID
		if id < DefaultUIDFirst || id > DefaultUIDLast || c.proc.spec.GID != id {
			t.Errorf("jail's ids %d/%d, want one id of %d-%d for both", id, c.proc.spec.GID, DefaultUIDFirst, DefaultUIDLast)
		}
		if want := strings.Repeat(strconv.Itoa(int(id))+"\t", 4); c.uid != want[:len(want)-1] {
			t.Errorf("agent's Uid %q seen from the host, want %d four times", c.uid, id)
		}
		if got, ok := parseScratchName(filepath.Base(c.proc.scratch)); !ok || got != id {
			t.Errorf("scratch directory %s is not named for uid %d", c.proc.scratch, id)
		}
	}
	if ua == ub {
		t.Errorf("two live jails share uid %q", ua)
	}
	pin := uint32(DefaultUIDFirst - 1)
	p, _ := startHolder(t, s, Options{Config: Config{UID: &pin}})
	if got := agentUID(t, p); got != "58999\t58999\t58999\t58999" {
		t.Errorf("pinned jail: agent's Uid %q, want 58999", got)
	}
	spec, err := Build(Options{Config: Config{UID: &pin}, Argv: []string{s.exe}, Root: s.root, Env: holdEnv(), Helper: s.exe})
	mustDo(t, err)
	if second, err := Start(spec, io.Discard); !errors.Is(err, ErrUID) {
		if second != nil {
			second.Kill()
			second.Wait()
		}
		t.Errorf("a second jail pinned to the live jail's uid 58999: %v, want ErrUID", err)
	}
}

// TestIntegrationJailSweep: a custodian SIGKILLed while its jail runs
// leaves the jail's (empty, root's) scratch directory and its (empty)
// cgroup behind; the next start removes both. Positive control: with the
// sweep off, a start leaves them in place.
func TestIntegrationJailSweep(t *testing.T) {
	testenv.Require(t, "root", "bwrap", "cgroup-limits")
	s := newScene(t)
	parent := filepath.Join(s.base, "scratch")
	mustDo(t, os.Mkdir(parent, 0o755))
	planJSON, err := json.Marshal(custodianPlan{Exe: s.exe, Root: s.root, ScratchParent: parent})
	mustDo(t, err)
	cmd := exec.Command(s.exe)
	cmd.Env = append(os.Environ(), envCustodian+"="+string(planJSON))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	mustDo(t, err)
	mustDo(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the helper custodian printed no scratch directory: %v", err)
	}
	left := strings.Fields(line) // the scratch directory, then the cgroup's
	if len(left) < 2 {
		t.Fatalf("the helper custodian printed %q, want its scratch directory and cgroup", line)
	}
	mustDo(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	for _, d := range left {
		if _, err := os.Lstat(d); err != nil {
			t.Fatalf("the killed custodian's %s: %v; want it left behind (the case the sweep is for)", d, err)
		}
	}
	pin := uint32(DefaultUIDFirst - 2) // never the stale uid, whose own cgroup a start replaces
	skipSweep = true
	p, _ := startHolder(t, s, Options{Config: Config{UID: &pin}, ScratchParent: parent})
	skipSweep = false
	for _, d := range left {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("positive control: with the sweep off, %s: %v; want it still there", d, err)
		}
	}
	p.Stdin.Close()
	mustDo(t, p.Wait())
	startHolder(t, s, Options{Config: Config{UID: &pin}, ScratchParent: parent})
	for _, d := range left {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after the next start, %s: %v; want it swept", d, err)
		}
	}
}

func TestParseCgroupName(t *testing.T) {
	if uid, ok := parseCgroupName(cgroupName(59123)); !ok || uid != 59123 {
		t.Errorf("%s: %d, %v", cgroupName(59123), uid, ok)
	}
	for _, name := range []string{"tether-jail-", "tether-jail-0", "tether-jail-059123", "tether-jail-59123-1", "tether-jail-4294967296",
		"tether-jail-+1", "tether-sandbox"} {
		if uid, ok := parseCgroupName(name); ok {
			t.Errorf("%s: parsed as uid %d, want refused", name, uid)
		}
	}
}

// FuzzParseCgroupName: a name that parses is exactly cgroupName of its
// uid.
func FuzzParseCgroupName(f *testing.F) {
	f.Add("tether-jail-59123")
	f.Add("tether-jail-059123")
	f.Fuzz(func(t *testing.T, name string) {
		if uid, ok := parseCgroupName(name); ok && (uid == 0 || name != cgroupName(uid)) {
			t.Fatalf("%q parsed as uid %d", name, uid)
		}
	})
}

func TestParseScratchName(t *testing.T) {
	for name, want := range map[string]uint32{"tether-jail-59123-4021": 59123, "tether-jail-1-0": 1} {
		if got, ok := parseScratchName(name); !ok || got != want {
			t.Errorf("%s: %d, %v; want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"tether-jail-4021", "tether-jail-0-1", "tether-jail-059123-1", "tether-jail-59123-",
		"tether-jail-59123-1x", "tether-jail--1", "tether-jail-4294967296-1", "other-59123-1", "tether-jail-59123-1/.."} {
		if got, ok := parseScratchName(name); ok {
			t.Errorf("%s: parsed as uid %d, want refused", name, got)
		}
	}
}

// FuzzParseScratchName: a name that parses is exactly the name the jail
// makes for that uid.
func FuzzParseScratchName(f *testing.F) {
	f.Add("tether-jail-59123-4021")
	f.Add("tether-jail-059123-1")
	f.Fuzz(func(t *testing.T, name string) {
		uid, ok := parseScratchName(name)
		if !ok {
			return
		}
		prefix := strings.TrimSuffix(scratchPattern(uid), "*")
		if uid == 0 || !strings.HasPrefix(name, prefix) || !allDigits(name[len(prefix):]) {
			t.Fatalf("%q parsed as uid %d", name, uid)
		}
	})
}

func TestStatusIDs(t *testing.T) {
	out := map[uint32]bool{}
	statusIDs("Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t7\t7\t7\t7\nGroups:\t5 6\n", out)
	for _, id := range []uint32{1000, 1001, 1002, 1003, 7} {
		if !out[id] {
			t.Errorf("id %d missing from %v", id, out)
		}
	}
	if out[5] || out[6] || len(out) != 5 {
		t.Errorf("ids %v, want the Uid and Gid lines' only", out)
	}
}
