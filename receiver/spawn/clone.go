package spawn

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrCloneUnsupported is wrapped when a Spec asks for ModeClone where this
// build or kernel cannot run it (see CloneSupported).
var ErrCloneUnsupported = errors.New("ModeClone is not supported here")

// CloneSupported reports whether ModeClone can run: an amd64 build, a
// kernel of 5.7 or later (clone3 with CLONE_INTO_CGROUP and
// CLONE_CLEAR_SIGHAND), and a clone3 that no seccomp filter around the
// receiver hides (it answers a zero-sized clone3 with EINVAL, not ENOSYS).
func CloneSupported() error { return cloneSupported() }

var cloneSupported = sync.OnceValue(func() error {
	if !cloneArch {
		return fmt.Errorf("%w: the clone stub is amd64 only, not %s", ErrCloneUnsupported, runtime.GOARCH)
	}
	k, err := kernelVersion()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCloneUnsupported, err)
	}
	if k[0] < 5 || k[0] == 5 && k[1] < 7 {
		return fmt.Errorf("%w: kernel %d.%d lacks CLONE_INTO_CGROUP (5.7)", ErrCloneUnsupported, k[0], k[1])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); e != unix.EINVAL {
		return fmt.Errorf("%w: clone3 probe: %v", ErrCloneUnsupported, e)
	}
	return nil
})

// cloneArgs is the kernel's struct clone_args up to its cgroup field
// (CLONE_ARGS_SIZE_VER2).
type cloneArgs struct {
	flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls, setTID, setTIDSize, cgroup uint64
}

var _ [88 - unsafe.Sizeof(cloneArgs{})]byte
var _ [unsafe.Sizeof(cloneArgs{}) - 88]byte

// The child shares the receiver's memory until its execve, during which
// the spawning thread sleeps (CLONE_VM, CLONE_VFORK: no page tables are
// copied), and starts with every signal handler reset to the default
// (CLONE_CLEAR_SIGHAND), so no receiver handler runs in it. With a
// cgroup, the clone puts it there (CLONE_INTO_CGROUP).
const (
	cloneFlags      = unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_CLEAR_SIGHAND
	cloneIntoCgroup = unix.CLONE_INTO_CGROUP
)

// step is one raw system call of the child's program. When mismatch is
// not zero the call must also return want, or the child fails with errno
// mismatch.
type step struct {
	nr                     uintptr
	a1, a2, a3, a4, a5, a6 uintptr
	want, mismatch         uintptr
	name                   string // for the parent's error message; the child never reads it
}

// clonePlan is everything rawClone and its child read. The child writes
// errno and left when a step fails; the parent reads them once the vfork
// has returned.
type clonePlan struct {
	args  *cloneArgs
	size  uintptr
	steps *step
	n     uintptr
	errno uintptr
	left  uintptr
	// mem holds every buffer a step's argument points into, so that they
	// are on the heap and alive until rawClone has returned.
	mem *cloneMem
}

type cloneMem struct {
	steps  []step
	path   *byte
	argv   []*byte
	env    []*byte
	groups []uint32
	sigset uint64 // empty: the command starts with no signal blocked
	fprog  unix.SockFprog
	filter *Filter
}

// newClonePlan prepares the child's program: stdin, stdout and stderr
// (in and out are at least 3, see lowFD), signals unblocked, a new
// session, the grant's groups, gid and uid, the parent-death signal
// (which the id change would have cleared) and the check that the parent
// is still the receiver, the seccomp filter if any, and execve.
func newClonePlan(spec *Spec, in, out int, cgroup *os.File) (*clonePlan, error) {
	m := &cloneMem{groups: append([]uint32{0}, spec.Groups...)[1:], filter: spec.Seccomp}
	var err error
	if m.path, err = syscall.BytePtrFromString(spec.Path); err != nil {
		return nil, fmt.Errorf("%w: path: %w", ErrSpec, err)
	}
	if m.argv, err = syscall.SlicePtrFromStrings(spec.Argv); err != nil {
		return nil, fmt.Errorf("%w: argv: %w", ErrSpec, err)
	}
	if m.env, err = syscall.SlicePtrFromStrings(spec.Env); err != nil {
		return nil, fmt.Errorf("%w: env: %w", ErrSpec, err)
	}
	var groups uintptr
	if len(m.groups) > 0 {
		groups = uintptr(unsafe.Pointer(&m.groups[0]))
	}
	u, g := uintptr(spec.UID), uintptr(spec.GID)
	m.steps = []step{
		{nr: unix.SYS_RT_SIGPROCMASK, a1: unix.SIG_SETMASK, a2: uintptr(unsafe.Pointer(&m.sigset)), a4: 8, name: "unblock signals"},
		{nr: unix.SYS_DUP3, a1: uintptr(in), a2: 0, name: "dup3 stdin"},
		{nr: unix.SYS_DUP3, a1: uintptr(out), a2: 1, name: "dup3 stdout"},
		{nr: unix.SYS_DUP3, a1: uintptr(out), a2: 2, name: "dup3 stderr"},
		{nr: unix.SYS_SETSID, name: "setsid"},
		{nr: unix.SYS_SETGROUPS, a1: uintptr(len(m.groups)), a2: groups, name: "setgroups"},
		{nr: unix.SYS_SETRESGID, a1: g, a2: g, a3: g, name: "setresgid"},
		{nr: unix.SYS_SETRESUID, a1: u, a2: u, a3: u, name: "setresuid"},
		{nr: unix.SYS_PRCTL, a1: unix.PR_SET_PDEATHSIG, a2: uintptr(syscall.SIGKILL), name: "set the parent-death signal"},
		{nr: unix.SYS_GETPPID, want: uintptr(os.Getpid()), mismatch: uintptr(unix.ESRCH), name: "check the parent is alive"},
	}
	if f := spec.Seccomp; f != nil { // last before execve: only the exec runs under it
		m.fprog = unix.SockFprog{Len: uint16(len(f.prog)), Filter: &f.prog[0]}
		m.steps = append(m.steps, step{nr: unix.SYS_SECCOMP, a1: unix.SECCOMP_SET_MODE_FILTER,
			a3: uintptr(unsafe.Pointer(&m.fprog)), name: "install the seccomp filter"})
	}
	m.steps = append(m.steps, step{nr: unix.SYS_EXECVE, a1: uintptr(unsafe.Pointer(m.path)),
		a2: uintptr(unsafe.Pointer(&m.argv[0])), a3: uintptr(unsafe.Pointer(&m.env[0])), name: "execute " + spec.Path})
	args := &cloneArgs{flags: cloneFlags, exitSignal: uint64(syscall.SIGCHLD)}
	if cgroup != nil {
		args.flags |= cloneIntoCgroup
		args.cgroup = uint64(cgroup.Fd())
	}
	return &clonePlan{args: args, size: unsafe.Sizeof(*args), steps: &m.steps[0], n: uintptr(len(m.steps)), mem: m}, nil
}

// lowFD returns f's descriptor if it is at least 3; otherwise a
// close-on-exec duplicate of it at 3 or above, which the caller closes,
// so that the child's dup3 onto 0, 1 and 2 never overwrites a source it
// still needs.
func lowFD(f *os.File) (fd int, dup bool, err error) {
	fd = int(f.Fd())
	if fd >= 3 {
		return fd, false, nil
	}
	if fd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3); err != nil {
		return -1, false, fmt.Errorf("%w: duplicate descriptor %d: %w", ErrStart, f.Fd(), err)
	}
	return fd, true, nil
}

// cloneChild forks and executes the child of a ModeClone spec from the
// calling, prepared spawning thread, and registers it. It returns once
// the child has executed the command, or failed to and been reaped.
//
// WARNING: security-sensitive. The child shares the receiver's memory
// until its execve and runs nothing but clone_amd64.s's loop over the
// plan: every id change, the parent-death signal and the seccomp filter
// are applied by the child to itself, in the order newClonePlan lists,
// and the cgroup is entered by the clone itself. Tested as root by
//
//	go test -race -run 'TestChildMasks|TestClone|TestSeccomp|TestCgroup|TestPdeathsig' ./receiver/spawn/
func (c *Child) cloneChild(spec *Spec, devNull *os.File) error {
	in, inDup, err := lowFD(devNull)
	if err != nil {
		return err
	}
	if inDup {
		defer unix.Close(in)
	}
	out, outDup, err := lowFD(spec.Output)
	if err != nil {
		return err
	}
	if outDup {
		defer unix.Close(out)
	}
	plan, err := newClonePlan(spec, in, out, spec.Cgroup)
	if err != nil {
		return err
	}
	// reg.mu, then ForkLock, the order of the os.StartProcess path; ForkLock
	// as os.StartProcess takes it: no descriptor is being made without
	// close-on-exec while the child's descriptor table is copied.
	reg.mu.RLock()
	syscall.ForkLock.Lock()
	r := rawClone(plan)
	runtime.KeepAlive(plan)
	runtime.KeepAlive(devNull)
	runtime.KeepAlive(spec.Output)
	runtime.KeepAlive(spec.Cgroup)
	syscall.ForkLock.Unlock()
	if e := syscall.Errno(-int(r)); int(r) < 0 {
		reg.mu.RUnlock()
		return fmt.Errorf("%w: clone3: %w", ErrStart, e)
	}
	pid := int(r)
	if plan.left != 0 { // a step failed: the child has exited (or is exiting) 127
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		reg.mu.RUnlock()
		s := plan.mem.steps[len(plan.mem.steps)-int(plan.left)]
		return fmt.Errorf("%w: child: %s: %w", ErrStart, s.name, syscall.Errno(plan.errno))
	}
	c.pid = pid
	c.pidfd = openPidfd(pid) // the child cannot be reaped before reg.mu is released
	register(c)
	reg.mu.RUnlock()
	wakeReaper()
	return nil
}
