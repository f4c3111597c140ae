package spawn

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
)

// TestCloneSupported: where ModeClone can run (amd64, kernel 5.7 or
// later) CloneSupported says so, so that no clone subtest is silently
// left out of the modes; elsewhere Start refuses ModeClone before
// touching any thread.
func TestCloneSupported(t *testing.T) {
	k, err := kernelVersion()
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.GOARCH == "amd64" && (k[0] > 5 || k[0] == 5 && k[1] >= 7)
	if got := CloneSupported(); (got == nil) != want {
		t.Fatalf("CloneSupported() = %v on %s, kernel %d.%d", got, runtime.GOARCH, k[0], k[1])
	}
	if want {
		return
	}
	dir, _ := os.Open(os.TempDir())
	defer dir.Close()
	_, err = Start(Spec{Mode: ModeClone, Path: "/bin/true", Argv: []string{"true"}, Dir: dir, Output: os.Stderr, UID: 1000, GID: 1000})
	if !errors.Is(err, ErrSpec) || !errors.Is(err, ErrCloneUnsupported) {
		t.Fatalf("Start = %v, want ErrSpec wrapping ErrCloneUnsupported", err)
	}
}

// TestClonePlanOrder: the child's program applies the ids before the
// parent-death signal (an id change clears it), checks the parent after
// arming it, and installs the seccomp filter last, right before execve,
// so nothing but the exec runs under it; without a filter there is no
// seccomp step.
func TestClonePlanOrder(t *testing.T) {
	spec := &Spec{Path: "/bin/true", Argv: []string{"true"}, Env: []string{}, UID: 1000, GID: 1000, Groups: []uint32{1001}}
	names := func(p *clonePlan) []string {
		var n []string
		for _, s := range p.mem.steps {
			n = append(n, s.name)
		}
		return n
	}
	want := []string{"unblock signals", "dup3 stdin", "dup3 stdout", "dup3 stderr", "setsid", "setgroups", "setresgid",
		"setresuid", "set the parent-death signal", "check the parent is alive", "execute /bin/true"}
	p, err := newClonePlan(spec, 3, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(p); !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	if p.args.cgroup != 0 || p.args.flags != cloneFlags {
		t.Fatalf("clone flags %#x cgroup %d, want %#x and none", p.args.flags, p.args.cgroup, cloneFlags)
	}
	spec.Seccomp = seccompFilter(t)
	dir, _ := os.Open(os.TempDir())
	defer dir.Close()
	if p, err = newClonePlan(spec, 3, 4, dir); err != nil {
		t.Fatal(err)
	}
	want = slices.Insert(want, len(want)-1, "install the seccomp filter")
	if got := names(p); !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	if p.args.cgroup != uint64(dir.Fd()) || p.args.flags != cloneFlags|cloneIntoCgroup {
		t.Fatalf("clone flags %#x cgroup %d, want %#x and %d", p.args.flags, p.args.cgroup, cloneFlags|cloneIntoCgroup, dir.Fd())
	}
}

// TestCloneSignalsAndFiles: the command of every mode starts with no
// signal blocked or caught (ModeClone's child never runs a receiver
// signal handler: CLONE_CLEAR_SIGHAND), and with the descriptors of a
// ModeThread child (os.StartProcess's): ModeClone's child copies the
// receiver's descriptor table, and none of the receiver's own may pass.
func TestCloneSignalsAndFiles(t *testing.T) {
	testenv.Require(t, "root")
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			out, st := run(t, mode, nil, "/bin/cat", "/proc/self/status") // cat catches no signal
			for _, want := range []string{"\nSigBlk:\t0000000000000000\n", "\nSigCgt:\t0000000000000000\n"} {
				if st != (Status{}) || !strings.Contains(out, want) {
					t.Fatalf("status %+v, /proc/self/status %q lacks %q", st, out, want)
				}
			}
			// The reference is ModeThread's, as the test process's own
			// inherited descriptors (without close-on-exec) pass to every child.
			want, _ := run(t, ModeThread, nil, "/bin/ls", "/proc/self/fd")
			out, st = run(t, mode, nil, "/bin/ls", "/proc/self/fd")
			if st != (Status{}) || out != want || !strings.HasPrefix(want, "0\n1\n") {
				t.Fatalf("status %+v, open descriptors %q, want %q", st, out, want)
			}
		})
	}
}

// TestCloneFailedStepStartsNothing: when a step of the child's program
// fails (here setgroups, with more groups than the kernel takes), Start
// names the step and its errno, and no process of the uid is left; the
// same spec with a valid group list starts (the positive control).
func TestCloneFailedStepStartsNothing(t *testing.T) {
	testenv.Require(t, "root", "clone3")
	dir, _ := workDir(t)
	_, w, _ := os.Pipe()
	defer w.Close()
	many := make([]uint32, 65537) // NGROUPS_MAX is 65536
	for i := range many {
		many[i] = gid
	}
	spec := Spec{Mode: ModeClone, Path: "/bin/true", Argv: []string{"true"}, Env: []string{}, Dir: dir, Output: w,
		UID: uid, GID: gid, Groups: many}
	_, err := Start(spec)
	if !errors.Is(err, ErrStart) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "setgroups") {
		t.Fatalf("Start = %v, want ErrStart naming setgroups, EINVAL", err)
	}
	assertNoUIDWithin(t, 0)
	_, err = Start(Spec{Mode: ModeClone, Path: dir.Name(), Argv: []string{"x"}, Env: []string{}, Dir: dir, Output: w,
		UID: uid, GID: gid})
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "execute") {
		t.Fatalf("Start of a directory = %v, want ErrStart naming the execute step", err)
	}
	assertNoUIDWithin(t, 0)
	spec.Groups = groups
	c, err := Start(spec)
	if err != nil {
		t.Fatalf("positive control: %v", err)
	}
	<-c.Done()
	if st := c.Status(); st != (Status{}) {
		t.Fatalf("positive control: status %+v", st)
	}
}

// TestCloneSeccompCgroupFromFirstInstruction: in ModeClone the filtered
// command starts in its cgroup (clone3 CLONE_INTO_CGROUP from a spawning
// thread without the filter) and runs under exactly one filter.
func TestCloneSeccompCgroupFromFirstInstruction(t *testing.T) {
	testenv.Require(t, "root", "cgroup2", "clone3")
	cg, dir := childCgroup(t, "t-clone-first")
	out, st := runWith(t, Spec{Mode: ModeClone, Cgroup: cg, Seccomp: seccompFilter(t)}, "/bin/sh", "-c",
		"cat /proc/self/cgroup; grep ^Seccomp /proc/self/status")
	for _, want := range []string{"0::" + cgrouptest.Rel(t, dir) + "\n", "\nSeccomp:\t2\nSeccomp_filters:\t1\n"} {
		if st != (Status{}) || !strings.Contains(out, want) {
			t.Fatalf("status %+v, output %q lacks %q", st, out, want)
		}
	}
}

// TestCloneSharedMemoryNotDumpable: a ModeClone child shares the
// receiver's memory from its setresuid to its execve. The kernel marks
// that memory non-dumpable at the setresuid (fs.suid_dumpable 0 or 2),
// so no process of the grant's uid may ptrace the child, and through it
// the receiver, in that window. The test process makes itself dumpable
// (the positive control: it reads back 1), starts a clone child, and
// finds its own memory non-dumpable.
func TestCloneSharedMemoryNotDumpable(t *testing.T) {
	testenv.Require(t, "root", "clone3")
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); d != 1 {
		t.Fatalf("positive control: dumpable %d after PR_SET_DUMPABLE 1", d)
	}
	if _, st := run(t, ModeClone, nil, "/bin/true"); st != (Status{}) {
		t.Fatalf("status %+v", st)
	}
	if d, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); d == 1 {
		b, _ := os.ReadFile("/proc/sys/fs/suid_dumpable")
		t.Fatalf("the receiver's memory stayed dumpable through a clone child's setresuid (fs.suid_dumpable %q)", b)
	}
}

// TestCloneLowDescriptors: a source descriptor below 3 is duplicated to 3
// or above before the fork, so the child's dup3 onto 0, 1 and 2 never
// overwrites a source it still needs: a ModeClone child whose output is
// the test's stderr (descriptor 2) finds it on its 1 and 2 and /dev/null
// on its 0.
func TestCloneLowDescriptors(t *testing.T) {
	fd, dup, err := lowFD(os.Stdin)
	if err != nil || !dup || fd < 3 {
		t.Fatalf("lowFD(stdin) = %d, %v, %v; want a duplicate at 3 or above", fd, dup, err)
	}
	unix.Close(fd)
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if fd, dup, err := lowFD(w); err != nil || dup || fd != int(w.Fd()) {
		t.Fatalf("lowFD(pipe) = %d, %v, %v; want the pipe's own %d", fd, dup, err, w.Fd())
	}
	testenv.Require(t, "root", "clone3")
	dir, _ := workDir(t)
	c, err := Start(Spec{Mode: ModeClone, Path: "/bin/sh", Argv: []string{"sh", "-c", "[ /proc/self/fd/1 -ef /proc/self/fd/2 ] && [ /proc/self/fd/0 -ef /dev/null ]"},
		Env: []string{}, Dir: dir, Output: os.Stderr, UID: uid, GID: gid})
	if err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if st := c.Status(); st != (Status{}) {
		t.Fatalf("status %+v", st)
	}
}
