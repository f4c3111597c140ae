package spawn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	dockerprofile "github.com/moby/profiles/seccomp"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
)

var (
	filterOnce sync.Once
	testFilter *Filter
	filterErr  error
)

// seccompFilter returns the computer's filter, compiled once per test
// binary.
func seccompFilter(t testing.TB) *Filter {
	t.Helper()
	filterOnce.Do(func() { testFilter, filterErr = NewFilter() })
	if filterErr != nil {
		t.Fatal(filterErr)
	}
	return testFilter
}

// runWith starts argv as the test uid with spec's Mode, Seccomp and
// Cgroup, waits for it and returns its output and status.
func runWith(t testing.TB, spec Spec, argv ...string) (string, Status) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := workDir(t)
	spec.Path, spec.Argv, spec.Dir, spec.Output = argv[0], argv, dir, w
	spec.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	spec.UID, spec.GID, spec.Groups = uid, gid, groups
	c, err := Start(spec)
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("Start %v: %v", argv, err)
	}
	out := make(chan []byte, 1)
	go func() {
		b, _ := readAll(r)
		r.Close()
		out <- b
	}()
	select {
	case <-c.Done():
	case <-time.After(60 * time.Second): // a bound for a slow guest, not a wait
		c.Kill()
		t.Fatalf("%v did not exit", argv)
	}
	return string(<-out), c.Status()
}

// probeScript makes each attack with raw system calls (python3 ctypes,
// single-threaded, so unshare(CLONE_NEWUSER) is allowed) and prints one
// "name result" line each: "ok" or the errno's name. The system call
// numbers come from argv, so the script is the same on every
// architecture. The namespace attacks come last: once unshared, the
// process holds every capability in its new user namespace, and
// AF_PACKET and NETLINK_NETFILTER sockets are then the kernel's to grant.
const probeScript = `
import ctypes, errno, os, sys
nr = dict(a.split("=") for a in sys.argv[1:])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(int(nr[name])), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
def report(name, r, e):
    print(name, "ok" if r >= 0 else errno.errorcode.get(e, str(e)), flush=True)
def fork_like(name, r, e):
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    report(name, r, e)
def fd(name, r, e):
    if r >= 0:
        os.close(r)
    report(name, r, e)
buf = lambda n: ctypes.create_string_buffer(n)
r, e = sc("keyctl", 0, -3, 1); report("keyctl", r, e)
attr = buf(128); ctypes.memset(attr, 0, 128)
fd("bpf", *sc("bpf", 0, ctypes.addressof(attr), 72))
pe = buf(128); ctypes.c_uint32.from_buffer(pe, 0).value = 1; ctypes.c_uint32.from_buffer(pe, 4).value = 64
ctypes.c_uint64.from_buffer(pe, 8).value = 1; ctypes.c_uint64.from_buffer(pe, 40).value = 0x60
fd("perf_event_open", *sc("perf_event_open", ctypes.addressof(pe), 0, -1, -1, 0))
params = buf(120)
fd("io_uring_setup", *sc("io_uring_setup", 1, ctypes.addressof(params)))
ca = buf(88); ctypes.c_uint64.from_buffer(ca, 32).value = 17
fork_like("clone3", *sc("clone3", ctypes.addressof(ca), 88))
fork_like("clone_newuser", *sc("clone", 0x10000000 | 17, 0, 0, 0, 0))
report("unshare_newuser", *sc("unshare", 0x10000000))
report("unshare_newnet", *sc("unshare", 0x40000000))
fd("af_packet", *sc("socket", 17, 3, 0))
fd("netlink_netfilter", *sc("socket", 16, 3, 12))
fd("netlink_route", *sc("socket", 16, 3, 0))
`

// probeArgs are the probe's argv with this architecture's numbers.
func probeArgs() []string {
	nrs := map[string]uintptr{"keyctl": unix.SYS_KEYCTL, "bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN,
		"io_uring_setup": unix.SYS_IO_URING_SETUP, "clone3": unix.SYS_CLONE3, "clone": unix.SYS_CLONE,
		"unshare": unix.SYS_UNSHARE, "socket": unix.SYS_SOCKET}
	argv := []string{"/usr/bin/python3", "-I", "-c", probeScript}
	for k, v := range nrs {
		argv = append(argv, fmt.Sprintf("%s=%d", k, v))
	}
	return argv
}

// Expected probe results under the filter, and with the filter off (the
// positive control: each attack succeeds). bpf's control shows the call
// reaching the kernel, which refuses the empty map attribute (EINVAL)
// before any privilege check; loading a program would also meet
// kernel.unprivileged_bpf_disabled where it is set.
var (
	probeFiltered = map[string]string{"keyctl": "ENOSYS", "bpf": "ENOSYS", "perf_event_open": "ENOSYS",
		"io_uring_setup": "ENOSYS", "clone3": "ENOSYS", "clone_newuser": "EPERM", "unshare_newuser": "EPERM",
		"unshare_newnet": "EPERM", "af_packet": "EAFNOSUPPORT", "netlink_netfilter": "EPROTONOSUPPORT",
		"netlink_route": "ok"}
	probeControl = map[string]string{"keyctl": "ok", "bpf": "EINVAL", "perf_event_open": "ok",
		"io_uring_setup": "ok", "clone3": "ok", "clone_newuser": "ok", "unshare_newuser": "ok",
		"unshare_newnet": "ok", "af_packet": "ok", "netlink_netfilter": "ok", "netlink_route": "ok"}
)

func parseProbe(t *testing.T, out string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, ok := strings.Cut(l, " ")
		if !ok {
			t.Fatalf("probe output line %q in\n%s", l, out)
		}
		got[k] = v
	}
	return got
}

// cgSeq numbers the cgroups of one test: a cgroup is never reused (the
// reaper's cgroup.kill of one child must not meet the next).
var cgSeq int

// seccompModes are the ways a filtered child starts: ModeThread without
// a cgroup, ModeHelper and ModeClone with and without one.
func seccompModes(t *testing.T) map[string]func(*testing.T) Spec {
	m := map[string]func(*testing.T) Spec{
		"thread": func(*testing.T) Spec { return Spec{Mode: ModeThread} },
		"helper": func(*testing.T) Spec { return Spec{Mode: ModeHelper} },
		"clone":  func(*testing.T) Spec { return Spec{Mode: ModeClone} },
		"clone-cgroup": func(t *testing.T) Spec {
			testenv.Require(t, "cgroup2")
			cgSeq++
			cg, _ := childCgroup(t, fmt.Sprintf("t-seccomp-%d", cgSeq))
			return Spec{Mode: ModeClone, Cgroup: cg}
		},
		"helper-cgroup": func(t *testing.T) Spec {
			testenv.Require(t, "cgroup2")
			cgSeq++
			cg, _ := childCgroup(t, fmt.Sprintf("t-seccomp-%d", cgSeq))
			return Spec{Mode: ModeHelper, Cgroup: cg}
		},
	}
	if CloneSupported() != nil { // TestCloneSupported fails where it should be
		delete(m, "clone")
		delete(m, "clone-cgroup")
	}
	return m
}

// TestSeccompDeniesAttacks makes every attack of SECURITY.md's seccomp
// row from a real child under the filter, in each spawn mode, and the
// same child with the filter off (the positive control).
func TestSeccompDeniesAttacks(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	for name, mk := range seccompModes(t) {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/filter=%v", name, on), func(t *testing.T) {
				spec, want := mk(t), probeControl
				if on {
					spec.Seccomp, want = f, probeFiltered
				}
				out, st := runWith(t, spec, probeArgs()...)
				if st != (Status{}) {
					t.Fatalf("status %+v, output %s", st, out)
				}
				if got := parseProbe(t, out); !reflect.DeepEqual(got, want) {
					t.Fatalf("probe results\n got %v\nwant %v", got, want)
				}
			})
		}
	}
}

// TestSeccompDeniesUnshareTool: util-linux unshare -U (the row's attack
// as a user would type it) fails under the filter and maps root without.
func TestSeccompDeniesUnshareTool(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	argv := []string{"/usr/bin/unshare", "-U", "-r", "/usr/bin/id", "-u"}
	for name, mk := range seccompModes(t) {
		t.Run(name, func(t *testing.T) {
			if out, st := runWith(t, mk(t), argv...); st.Code != 0 || out != "0\n" {
				t.Fatalf("control: status %+v, output %q; want exit 0 and uid 0 inside", st, out)
			}
			spec := mk(t)
			spec.Seccomp = f
			out, st := runWith(t, spec, argv...)
			if st.Code == 0 || !strings.Contains(out, "Operation not permitted") {
				t.Fatalf("filtered: status %+v, output %q; want unshare refused with EPERM", st, out)
			}
		})
	}
}

// seccompStatus returns the Seccomp and Seccomp_filters lines of a
// /proc status text.
func seccompStatus(t *testing.T, status string) (mode, filters string) {
	t.Helper()
	for _, l := range strings.Split(status, "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch k {
		case "Seccomp":
			mode = strings.TrimSpace(v)
		case "Seccomp_filters":
			filters = strings.TrimSpace(v)
		}
	}
	if mode == "" || filters == "" {
		t.Fatalf("no Seccomp lines in\n%s", status)
	}
	return mode, filters
}

// TestSeccompStatusAndMasks: a filtered child and its grandchild show
// Seccomp 2 with exactly one filter and keep every other control (ids,
// capability masks, no_new_privs); the unfiltered control shows 0 and 0.
func TestSeccompStatusAndMasks(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	for name, mk := range seccompModes(t) {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/filter=%v", name, on), func(t *testing.T) {
				spec, want := mk(t), [2]string{"0", "0"}
				if on {
					spec.Seccomp, want = f, [2]string{"2", "1"}
				}
				out, st := runWith(t, spec, "/bin/sh", "-c", "cat /proc/self/status; echo @@@; /bin/sh -c 'cat /proc/self/status'")
				parts := strings.Split(out, "@@@\n")
				if st != (Status{}) || len(parts) != 2 {
					t.Fatalf("status %+v, output %s", st, out)
				}
				for i, p := range parts {
					who := []string{"child", "grandchild"}[i]
					assertUnprivileged(t, who, p)
					if m, n := seccompStatus(t, p); [2]string{m, n} != want {
						t.Errorf("%s: Seccomp %s Seccomp_filters %s, want %s %s", who, m, n, want[0], want[1])
					}
				}
			})
		}
	}
}

// TestSeccompCgroupFromFirstInstruction: in ModeHelper the filtered
// command still starts in its cgroup.
func TestSeccompCgroupFromFirstInstruction(t *testing.T) {
	testenv.Require(t, "root", "cgroup2")
	cg, dir := childCgroup(t, "t-seccomp-first")
	out, st := runWith(t, Spec{Mode: ModeHelper, Cgroup: cg, Seccomp: seccompFilter(t)}, "/bin/cat", "/proc/self/cgroup")
	if want := "0::" + cgrouptest.Rel(t, dir) + "\n"; st != (Status{}) || !strings.Contains(out, want) {
		t.Fatalf("status %+v, /proc/self/cgroup of the child:\n%s\nwant the line %q", st, out, want)
	}
}

// TestSeccompThreadRefusesCgroup: ModeThread cannot fork a filtered
// child into a cgroup v2 (the fork is a clone3 the filter answers with
// ENOSYS), so Start refuses before touching any thread.
func TestSeccompThreadRefusesCgroup(t *testing.T) {
	f := seccompFilter(t)
	dir, err := os.Open(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	_, err = Start(Spec{Mode: ModeThread, Path: "/bin/true", Argv: []string{"true"}, Dir: dir, Output: os.Stderr,
		UID: 1000, GID: 1000, Seccomp: f, Cgroup: dir})
	if !errors.Is(err, ErrSpec) || !errors.Is(err, ErrSeccompThreadCgroup) {
		t.Fatalf("Start = %v, want ErrSpec wrapping ErrSeccompThreadCgroup", err)
	}
}

// TestSeccompWorkday: what a coding workday runs still works under the
// filter: a shell pipeline, sort, tar and gzip, cc on a tiny C file,
// python3 (a venv, a loopback server and a client), node, git.
func TestSeccompWorkday(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	script := `set -e
printf 'b\na\n' | sort | tr -d '\n'; echo
printf 'int main(void){return 42;}\n' > t.c
cc -o t t.c; ./t || echo "cc exit $?"
mkdir d; echo hi > d/f; tar czf d.tgz d; gzip -dc d.tgz | tar tf - | head -1
python3 -I -m venv --without-pip v && ./v/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix)'
python3 -I -c '
import socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
def serve():
    c, _ = s.accept(); c.sendall(b"pong"); c.close()
threading.Thread(target=serve).start()
c = socket.create_connection(s.getsockname()); print(c.recv(4).decode())'
node -e 'require("fs").writeFileSync("n.txt", String(6*7)); console.log(require("fs").readFileSync("n.txt","utf8"))'
git init -q r && cd r && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m m && git log --format=%s
`
	want := "ab\ncc exit 42\nd/\nTrue\npong\n42\nm\n"
	for name, mk := range seccompModes(t) {
		t.Run(name, func(t *testing.T) {
			spec := mk(t)
			spec.Seccomp = f
			if out, st := runWith(t, spec, "/bin/sh", "-c", script); st != (Status{}) || out != want {
				t.Fatalf("status %+v, output\n%s\nwant\n%s", st, out, want)
			}
		})
	}
}

// TestSeccompNoLeakIntoReceiver: after filtered spawns in ModeThread, no
// thread of this process runs under a filter.
func TestSeccompNoLeakIntoReceiver(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	for i := range 30 {
		if _, st := runWith(t, Spec{Mode: ModeThread, Seccomp: f}, "/bin/true"); st.Code != 0 {
			t.Fatalf("spawn %d: %+v", i, st)
		}
	}
	deadline := time.Now().Add(30 * time.Second) // spawning threads exit asynchronously
	for {
		bad := filteredThreads(t)
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads under a filter after their children were reaped: %v", bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// filteredThreads lists this process's threads whose Seccomp is not 0.
func filteredThreads(t *testing.T) []string {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "status"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		if m, n := seccompStatus(t, string(b)); m != "0" || n != "0" {
			bad = append(bad, fmt.Sprintf("thread %s: Seccomp %s filters %s", e.Name(), m, n))
		}
	}
	return bad
}

// TestSeccompFilterBytesRoundTrip: the program a helper receives decodes
// to the receiver's program.
func TestSeccompFilterBytesRoundTrip(t *testing.T) {
	f := seccompFilter(t)
	g, err := filterFromBytes(f.bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.prog, g.prog) {
		t.Fatal("program changed on its way to the helper")
	}
}

// FuzzFilterFromBytes: any byte string either decodes to whole
// instructions that encode back to it, or is refused.
func FuzzFilterFromBytes(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 7))
	f.Add(make([]byte, 8))
	f.Add(make([]byte, 8*(unix.BPF_MAXINSNS+1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := filterFromBytes(b)
		if err != nil {
			if !errors.Is(err, errFilterBytes) {
				t.Fatalf("error %v does not wrap errFilterBytes", err)
			}
			return
		}
		if got := g.bytes(); string(got) != string(b) {
			t.Fatalf("round trip %x != %x", got, b)
		}
	})
}

// BenchmarkSpawnSeccomp interleaves, in every iteration, a spawn of
// /bin/true without and with the filter, per mode, and reports both
// means and their ratio (load on this shared machine drifts).
func BenchmarkSpawnSeccomp(b *testing.B) {
	testenv.Require(b, "root")
	f := seccompFilter(b)
	dir, _ := workDir(b)
	for _, name := range []string{"thread", "helper"} {
		b.Run(name, func(b *testing.B) {
			_, w, _ := os.Pipe()
			defer w.Close()
			spec := Spec{Mode: modes[name], Path: "/bin/true", Argv: []string{"true"}, Env: []string{},
				Dir: dir, Output: w, UID: uid, GID: gid}
			filtered := spec
			filtered.Seccomp = f
			var plain, sec time.Duration
			for b.Loop() {
				t0 := time.Now()
				startReap(b, spec)
				t1 := time.Now()
				startReap(b, filtered)
				plain, sec = plain+t1.Sub(t0), sec+time.Since(t1)
			}
			b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "plain-ns/op")
			b.ReportMetric(float64(sec.Nanoseconds())/float64(b.N), "seccomp-ns/op")
			b.ReportMetric(float64(sec)/float64(plain), "ratio")
		})
	}
}

// BenchmarkSeccompHelperVsThread compares the two designs of a filtered
// spawn: ModeThread (no cgroup) against ModeHelper, interleaved.
func BenchmarkSeccompHelperVsThread(b *testing.B) {
	testenv.Require(b, "root")
	f := seccompFilter(b)
	dir, _ := workDir(b)
	_, w, _ := os.Pipe()
	defer w.Close()
	thread := Spec{Mode: ModeThread, Path: "/bin/true", Argv: []string{"true"}, Env: []string{},
		Dir: dir, Output: w, UID: uid, GID: gid, Seccomp: f}
	helper := thread
	helper.Mode = ModeHelper
	var dt, dh time.Duration
	for b.Loop() {
		t0 := time.Now()
		startReap(b, thread)
		t1 := time.Now()
		startReap(b, helper)
		dt, dh = dt+t1.Sub(t0), dh+time.Since(t1)
	}
	b.ReportMetric(float64(dt.Nanoseconds())/float64(b.N), "thread-ns/op")
	b.ReportMetric(float64(dh.Nanoseconds())/float64(b.N), "helper-ns/op")
	b.ReportMetric(float64(dh)/float64(dt), "ratio")
}

func startReap(b *testing.B, spec Spec) {
	c, err := Start(spec)
	if err != nil {
		b.Fatal(err)
	}
	<-c.Done()
}

// BenchmarkNewFilter is the cost of compiling the filter (once per
// receiver start).
func BenchmarkNewFilter(b *testing.B) {
	for b.Loop() {
		if _, err := NewFilter(); err != nil {
			b.Fatal(err)
		}
	}
}

// evalFilter runs the classic BPF program f on one struct seccomp_data
// (little-endian) and returns the action; it knows the opcodes compile
// emits and fails the test on any other.
func evalFilter(t *testing.T, f *Filter, auditArch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[offNr:], nr)
	binary.LittleEndian.PutUint32(data[offArch:], auditArch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[offArgs+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(f.prog); pc++ {
		in := f.prog[pc]
		cond := false
		switch in.Code {
		case bpfLdAbsW:
			acc = binary.LittleEndian.Uint32(data[in.K:])
			continue
		case bpfRet:
			return in.K
		case bpfJa:
			pc += int(in.K)
			continue
		case bpfJeq:
			cond = acc == in.K
		case bpfJgt:
			cond = acc > in.K
		case bpfJge:
			cond = acc >= in.K
		case bpfJset:
			cond = acc&in.K != 0
		default:
			t.Fatalf("instruction %d: opcode %#x", pc, in.Code)
		}
		if cond {
			pc += int(in.Jt)
		} else {
			pc += int(in.Jf)
		}
	}
	t.Fatal("the program ran off its end")
	return 0
}

// TestFilterDecisions evaluates the emitted program on calls whose fate
// the rules fix, including those go-seccomp-bpf's assembler got wrong
// (clone with CLONE_CHILD_SETTID after a failed argument condition) and
// arguments with stray high bits.
func TestFilterDecisions(t *testing.T) {
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	f := seccompFilter(t)
	allow, eperm := uint32(unix.SECCOMP_RET_ALLOW), uint32(unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM))
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
	id := uint32(info.ID)
	cases := []struct {
		name string
		arch uint32
		nr   uint32
		args []uint64
		want uint32
	}{
		{"read", id, unix.SYS_READ, nil, allow},
		{"fork flags", id, unix.SYS_CLONE, []uint64{unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)}, allow},
		{"thread flags", id, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM}, allow},
		{"vfork flags", id, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, allow},
		{"clone newuser", id, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone newnet", id, unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET}, eperm},
		{"clone3", id, unix.SYS_CLONE3, nil, errno(unix.ENOSYS)},
		{"unshare fs", id, unix.SYS_UNSHARE, []uint64{unix.CLONE_FS}, eperm},
		{"socket inet", id, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, allow},
		{"socket unix", id, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socket inet6", id, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, allow},
		{"netlink route", id, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, allow},
		{"netlink netfilter", id, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER}, errno(unix.EPROTONOSUPPORT)},
		{"netlink route, high bits", id, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 1 << 32}, errno(unix.EPROTONOSUPPORT)},
		{"packet", id, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0}, errno(unix.EAFNOSUPPORT)},
		{"packet, high bits", id, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_PACKET, unix.SOCK_RAW, 0}, errno(unix.EAFNOSUPPORT)},
		{"inet, high bits", id, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_INET, unix.SOCK_RAW, 0}, errno(unix.EAFNOSUPPORT)},
		{"vsock", id, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, errno(unix.EAFNOSUPPORT)},
		{"socket 56 (the assembler's confusion)", id, unix.SYS_SOCKET, []uint64{56, 0, 0}, errno(unix.EAFNOSUPPORT)},
		{"socketpair unix", id, unix.SYS_SOCKETPAIR, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socketpair tipc", id, unix.SYS_SOCKETPAIR, []uint64{unix.AF_TIPC, unix.SOCK_STREAM, 0}, errno(unix.EAFNOSUPPORT)},
		{"personality query", id, unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow},
		{"personality other", id, unix.SYS_PERSONALITY, []uint64{0x0040000}, eperm},
		{"io_uring", id, unix.SYS_IO_URING_SETUP, nil, errno(unix.ENOSYS)},
		{"keyctl", id, unix.SYS_KEYCTL, nil, errno(unix.ENOSYS)},
		{"ptrace", id, unix.SYS_PTRACE, nil, eperm},
		{"mount", id, unix.SYS_MOUNT, nil, eperm},
		{"seccomp (nested filters)", id, unix.SYS_SECCOMP, nil, allow},
		{"number beyond the table", id, maxNumber(info) + 1, nil, errno(unix.ENOSYS)},
		{"known, in no allow rule", id, unix.SYS_ACCT, nil, eperm},
		{"other architecture", 0x40000003, unix.SYS_READ, nil, eperm},
	}
	if info.ID == arch.X86_64.ID {
		cases = append(cases, struct {
			name string
			arch uint32
			nr   uint32
			args []uint64
			want uint32
		}{"x32", id, uint32(arch.X32.SeccompMask) | unix.SYS_READ, nil, errno(unix.ENOSYS)})
	}
	t.Logf("%d instructions", f.Len())
	for _, c := range cases {
		if got := evalFilter(t, f, c.arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: action %#x, want %#x", c.name, got, c.want)
		}
	}
}

// TestSecurityMDListsEveryRule: SECURITY.md's seccomp section names every
// system call a tightening matches, so the table cannot fall behind the
// filter.
func TestSecurityMDListsEveryRule(t *testing.T) {
	b, err := os.ReadFile("../../SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### Receiver: seccomp filter\n")
	if !ok {
		t.Fatal("SECURITY.md has no section \"Receiver: seccomp filter\"")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	for _, r := range tightenings {
		for _, n := range r.Names {
			if !strings.Contains(section, "`"+n+"`") && !strings.Contains(section, "`"+n+"(") {
				t.Errorf("SECURITY.md's seccomp section does not name %s", n)
			}
		}
	}
}

// ruleDecision is the reference: groups read in order, the first rule
// that matches nr and whose conditions all hold decides; else ENOSYS
// beyond the table and EPERM within it.
func ruleDecision(info *arch.Info, groups []bpfseccomp.SyscallGroup, nr uint32, args [6]uint64) uint32 {
	for _, g := range groups {
		for _, n := range g.Names {
			if uint32(info.SyscallNames[n]) == nr {
				return uint32(g.Action)
			}
		}
		for _, nc := range g.NamesWithCondtions {
			if uint32(info.SyscallNames[nc.Name]) == nr && holds(nc.Conditions, args) {
				return uint32(g.Action)
			}
		}
	}
	if nr > maxNumber(info) {
		return unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	}
	return unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
}

func holds(conds []bpfseccomp.Condition, args [6]uint64) bool {
	for _, c := range conds {
		v := args[c.Argument]
		ok := map[bpfseccomp.Operation]bool{
			bpfseccomp.Equal: v == c.Value, bpfseccomp.NotEqual: v != c.Value,
			bpfseccomp.LessThan: v < c.Value, bpfseccomp.LessOrEqual: v <= c.Value,
			bpfseccomp.GreaterThan: v > c.Value, bpfseccomp.GreaterOrEqual: v >= c.Value,
			bpfseccomp.BitsSet: v&c.Value != 0, bpfseccomp.BitsNotSet: v&c.Value == 0,
		}[c.Operation]
		if !ok {
			return false
		}
	}
	return true
}

// TestFilterMatchesRules runs the emitted program for every system call
// number up to past the table, with argument vectors that sit on each
// side of every condition, and compares it with the rules read in order.
func TestFilterMatchesRules(t *testing.T) {
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	kernel, err := kernelVersion()
	if err != nil {
		t.Fatal(err)
	}
	docker, err := dockerGroups(dockerprofile.DefaultProfile(), info, kernel)
	if err != nil {
		t.Fatal(err)
	}
	groups := append(tighteningGroups(), docker...)
	vectors := [][6]uint64{{}}
	for _, g := range groups {
		for _, nc := range g.NamesWithCondtions {
			for _, c := range nc.Conditions {
				for _, v := range []uint64{c.Value, c.Value - 1, c.Value + 1, c.Value | 1<<32, ^c.Value} {
					var args [6]uint64
					args[c.Argument] = v
					vectors = append(vectors, args)
				}
			}
		}
	}
	f := seccompFilter(t)
	id := uint32(info.ID)
	checked := 0
	for nr := uint32(0); nr <= maxNumber(info)+2; nr++ {
		for _, args := range vectors {
			want := ruleDecision(info, groups, nr, args)
			if got := evalFilter(t, f, id, nr, args[:]...); got != want {
				t.Fatalf("nr %d args %x: program %#x, rules %#x", nr, args, got, want)
			}
			checked++
		}
	}
	t.Logf("%d calls compared", checked)
}

// TestSeccompPdeathsig: a filtered child still dies with its spawning
// thread, in both modes (the helper re-arms the parent-death signal
// before it installs the filter). TestPdeathsigSpawningThread is the
// same without the filter.
func TestSeccompPdeathsig(t *testing.T) {
	testenv.Require(t, "root")
	f := seccompFilter(t)
	dir, _ := workDir(t)
	devNull, _ := os.Open(os.DevNull)
	defer devNull.Close()
	_, w, _ := os.Pipe()
	defer w.Close()
	startReaper()
	for name, mode := range modes {
		c := &Child{done: make(chan struct{})}
		errc := make(chan error)
		go func() {
			runtime.LockOSThread() // the thread ends with this goroutine
			errc <- c.launch(&Spec{Mode: mode, Path: "/bin/sleep", Argv: []string{"sleep", "100"}, Env: []string{},
				Dir: dir, Output: w, UID: uid, GID: gid, Seccomp: f}, devNull)
		}()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
		case <-time.After(30 * time.Second):
			c.Kill()
			t.Fatalf("%s: filtered child survived the end of its spawning thread", name)
		}
		if st := c.Status(); st.Signal != syscall.SIGKILL {
			t.Fatalf("%s: status %+v, want SIGKILL", name, st)
		}
	}
}
