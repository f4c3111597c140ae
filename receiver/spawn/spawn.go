// Package spawn starts every child of the receiver. Start is the one
// function that does it: on a fresh goroutine locked to its OS thread it
// empties that thread's bounding, inheritable and ambient capability sets,
// sets no_new_privs, optionally enforces a Landlock ruleset and then a
// seccomp filter on that thread alone, and forks the child with the
// grant's credentials in a new session with SIGKILL as its parent-death
// signal (with a filter and a cgroup v2, ModeClone's child or the helper
// installs the filter: see Spec.Seccomp). The thread stays locked until
// the child is reaped and is then destroyed, never reused.
//
// spawn owns every child of the process: one reaper goroutine waits for
// all of them (and, because the process becomes a child subreaper, for
// orphaned grandchildren too). A process that uses spawn must not start
// children by other means.
package spawn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
)

// The main goroutine never runs a spawn: a locked goroutine that ends on
// the main thread would leave that thread wedged with a child's
// restrictions instead of destroying it. Pinning main to the main thread
// keeps every other goroutine off it.
func init() { runtime.LockOSThread() }

// Mode selects how a child's restrictions are applied.
type Mode int

const (
	// ModeThread applies them to a locked spawning thread that the child
	// inherits them from: no extra exec, the default.
	ModeThread Mode = iota
	// ModeHelper re-executes the receiver binary as a small helper that
	// restricts itself and then executes the command (tailscale's be-child
	// pattern): one extra Go start per child, for kernels or builds where
	// a per-thread attribute cannot be set.
	ModeHelper
	// ModeClone restricts the spawning thread as ModeThread does, but
	// forks the child with spawn's own clone3 (CLONE_VM, CLONE_VFORK,
	// CLONE_CLEAR_SIGHAND and, with a Cgroup, CLONE_INTO_CGROUP), and the
	// child, before its execve, sets its own session, groups, gid, uid,
	// parent-death signal and the seccomp filter, with raw system calls
	// only (clone_amd64.s). So a filter and a cgroup v2 together cost one
	// fork and one exec, as ModeThread without a filter does, instead of
	// ModeHelper's second process. Needs CloneSupported.
	ModeClone
)

// Spec describes one child. Start does not modify it or take ownership of
// its files; the caller closes Dir and Output after Start returns.
type Spec struct {
	Mode Mode
	// Path is the absolute path of the executable, or a bare name (no
	// slash) that Start looks up in Search with the child's own identity
	// (see Search). Argv includes argv[0].
	Path string
	// Search lists the absolute directories a bare Path is looked up in,
	// in order. The lookup runs on the spawning thread with the child's
	// uid, gid and groups as its filesystem identity and without the
	// receiver's file capabilities, so a directory the child could not
	// search, or a file it could not execute, is skipped exactly like a
	// missing one: the receiver's privileges never reveal a file the
	// command's user cannot reach. Not found wraps ErrNotFound.
	Search []string
	Argv   []string
	// Env is the child's whole environment ("KEY=value"); nothing is
	// inherited. Loader variables are refused (see CheckEnv).
	Env []string
	// Dir is the child's working directory, an open directory (O_PATH is
	// enough) the spawning thread fchdirs to.
	Dir *os.File
	// UID, GID and Groups are the child's credentials; none may be 0.
	UID, GID uint32
	Groups   []uint32
	// Output receives the child's stdout and stderr; stdin is /dev/null.
	Output *os.File
	// Landlock, when non-nil, is enforced on the child (and only on the
	// spawning thread of the receiver).
	Landlock *Ruleset
	// Seccomp, when non-nil, is the filter the child runs under. In
	// ModeThread it is installed on the spawning thread alone, last, right
	// before the fork; the filter answers ENOSYS to clone3, so ModeThread
	// refuses a Seccomp with a Cgroup (the fork itself is a clone3 with
	// CLONE_INTO_CGROUP): use ModeClone, whose child is cloned into the
	// cgroup from the unfiltered spawning thread and installs the filter on
	// itself after dropping to the grant's user, right before its execve;
	// or ModeHelper, whose helper is forked into the cgroup unfiltered and
	// installs the filter on itself, with TSYNC, at the same point
	// (docs/decisions.md).
	Seccomp *Filter
	// Cgroup, when non-nil, is an open cgroup v2 directory (O_PATH is
	// enough) the child is forked straight into (clone3 with
	// CLONE_INTO_CGROUP: the child never runs outside it; in ModeHelper the
	// helper is forked into it and the command inherits it). Start opens
	// its cgroup.kill before the spawning thread is restricted, and every
	// SIGKILL of the group (Kill, the reaper's kill when the leader exits)
	// also writes "1" to it, so a descendant that left the process group
	// with setsid or setpgid is killed too. The cgroup is the caller's: it
	// creates it, keeps it for the child alone and removes it after the
	// child is reaped. nil starts the child in the receiver's own cgroup.
	Cgroup *os.File
	// CgroupsV1 move the child into cgroup v1 hierarchies (pids, memory)
	// that hold the computer's limits, where cgroup v2 lacks those
	// controllers: see CgroupV1.
	CgroupsV1 []CgroupV1
	// HelperPath is the receiver binary for ModeHelper ("" means
	// /proc/self/exe).
	HelperPath string
	// OnCallingThread makes Start fork from the calling goroutine's own OS
	// thread instead of a fresh goroutine's, which saves a hand-off between
	// threads on every start. Start locks the calling goroutine to its
	// thread and never unlocks it, and in ModeThread it restricts that
	// thread (bounding set, no_new_privs, Landlock, seccomp filter) for
	// good. So the caller must own the goroutine: it must run nothing on
	// it afterwards that needs privileges, files outside the grant root or
	// a system call the filter denies, must keep it until
	// the child is reaped (the thread's exit is the child's parent-death
	// signal), and must then let it end, which destroys the thread.
	// receiver uses it only on a goroutine the wire server started for the
	// one request (wire.OwnsGoroutine).
	OnCallingThread bool
}

// CgroupV1 is one cgroup v1 hierarchy a child starts in. Join and Back
// are open, writable `tasks` files: the spawning thread writes "0" to
// Join (moving itself alone) right before it forks, so the child is in
// that cgroup from its first instruction, and "0" to Back (the
// receiver's own cgroup in that hierarchy) right after, so the thread,
// which lives until the child is reaped, is not counted there. Start
// neither takes ownership of the files nor closes them.
type CgroupV1 struct {
	Join, Back *os.File
}

// Errors callers branch on.
var (
	// ErrSpec wraps every invalid Spec.
	ErrSpec = errors.New("invalid child spec")
	// ErrLoaderEnv is wrapped when Env names a loader variable.
	ErrLoaderEnv = errors.New("loader variable refused")
	// ErrCapability wraps *CapError: the spawning thread lacks a capability
	// it needs to start and control a child. No child is started.
	ErrCapability = errors.New("spawning thread lacks a capability")
	// ErrStart wraps a failure to prepare the thread or execute the child.
	ErrStart = errors.New("start child")
	// ErrNotFound is wrapped when a bare Path is in none of the Search
	// directories as the child's user sees them. Nothing was started.
	ErrNotFound = errors.New("command not found")
	// ErrSeccompThreadCgroup is wrapped when a Spec asks ModeThread for
	// both a seccomp filter and a cgroup v2: the filtered spawning thread
	// could not fork with clone3 into the cgroup. ModeClone and ModeHelper
	// do both.
	ErrSeccompThreadCgroup = errors.New("a seccomp filter and a cgroup v2 need ModeClone or ModeHelper")
)

// validate checks the spec before any thread is touched.
func (s *Spec) validate() error {
	switch {
	case strings.ContainsRune(s.Path, 0) || !filepath.IsAbs(s.Path) && !isBareName(s.Path):
		return fmt.Errorf("%w: path %q is neither absolute nor a bare command name", ErrSpec, s.Path)
	case len(s.Argv) == 0:
		return fmt.Errorf("%w: argv is empty", ErrSpec)
	case s.Dir == nil || s.Output == nil:
		return fmt.Errorf("%w: Dir and Output are required", ErrSpec)
	case s.UID == 0 || s.GID == 0:
		return fmt.Errorf("%w: uid %d gid %d: a child never runs with id 0", ErrSpec, s.UID, s.GID)
	case s.Mode != ModeThread && s.Mode != ModeHelper && s.Mode != ModeClone:
		return fmt.Errorf("%w: unknown mode %d", ErrSpec, s.Mode)
	case s.Mode == ModeThread && s.Seccomp != nil && s.Cgroup != nil:
		return fmt.Errorf("%w: %w", ErrSpec, ErrSeccompThreadCgroup)
	}
	if s.Mode == ModeClone {
		if err := cloneSupported(); err != nil {
			return fmt.Errorf("%w: %w", ErrSpec, err)
		}
	}
	for _, g := range s.Groups {
		if g == 0 {
			return fmt.Errorf("%w: supplementary group 0", ErrSpec)
		}
	}
	for _, a := range s.Argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("%w: argv contains NUL", ErrSpec)
		}
	}
	for _, d := range s.Search {
		if !filepath.IsAbs(d) || strings.ContainsRune(d, 0) {
			return fmt.Errorf("%w: search directory %q is not absolute", ErrSpec, d)
		}
	}
	return CheckEnv(s.Env)
}

// isBareName reports whether p names a command without any directory.
func isBareName(p string) bool {
	return p != "" && p != "." && p != ".." && !strings.ContainsRune(p, '/')
}

// Status is how a child ended.
type Status struct {
	Code   int            // exit code; -1 when Signal is set
	Signal syscall.Signal // the terminating signal, 0 after a normal exit
}

// Child is a started child, the leader of its own session and process
// group. Its methods are safe for concurrent use.
type Child struct {
	pid    int
	pidfd  *os.File // pollable pidfd for Reap; nil without pidfd support
	cgkill *os.File // cgroup.kill of Spec.Cgroup, write-only; nil without a cgroup
	done   chan struct{}
	mu     sync.Mutex // guards status, reaped
	reaped bool
	status Status
}

// PID returns the child's pid, which is also its process group id.
func (c *Child) PID() int { return c.pid }

// Done is closed once the child has exited, every member of its process
// group has been sent SIGKILL, and the child has been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Status returns how the child ended; valid once Done is closed.
func (c *Child) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Kill sends SIGKILL to the child's whole process group and, with a
// Spec.Cgroup, to every process of that cgroup (cgroup.kill), including
// descendants that left the group. After the child is reaped it does
// nothing: its pgid may then belong to someone else, and the reaper has
// already killed the cgroup.
func (c *Child) Kill() error { return c.Signal(syscall.SIGKILL) }

// Signal sends sig to the child's whole process group while the child is
// not reaped (the zombie pins the pgid, so the signal cannot reach an
// unrelated group); SIGKILL also kills the child's cgroup, if any.
// Signalling an exited group is not an error.
func (c *Child) Signal(sig syscall.Signal) error {
	reg.mu.RLock() // the reaper reaps under the write lock
	defer reg.mu.RUnlock()
	c.mu.Lock()
	reaped := c.reaped
	c.mu.Unlock()
	if reaped {
		return nil
	}
	var errGroup error
	if err := syscall.Kill(-c.pid, sig); err != nil && err != syscall.ESRCH {
		errGroup = fmt.Errorf("signal process group %d: %w", c.pid, err)
	}
	if sig != syscall.SIGKILL {
		return errGroup
	}
	return errors.Join(errGroup, c.killCgroup())
}

// killCgroup writes "1" to the child's cgroup.kill: the kernel sends
// SIGKILL to every process in the cgroup, and a fork racing with it is
// killed too. The caller holds reg.mu (for reading or writing), so the
// descriptor is not closed meanwhile.
func (c *Child) killCgroup() error {
	if c.cgkill == nil {
		return nil
	}
	if _, err := c.cgkill.Write([]byte("1")); err != nil {
		return fmt.Errorf("kill the cgroup of child %d (cgroup.kill): %w", c.pid, err)
	}
	return nil
}

// finish records the status; the caller holds reg.mu for writing.
func (c *Child) finish(ws syscall.WaitStatus) {
	c.mu.Lock()
	c.reaped = true
	switch {
	case ws.Signaled():
		c.status = Status{Code: -1, Signal: ws.Signal()}
	default:
		c.status = Status{Code: ws.ExitStatus()}
	}
	c.mu.Unlock()
	close(c.done)
	if c.pidfd != nil {
		_ = c.pidfd.Close() // a Reap still waiting on it wakes up and finds Done closed
	}
	if c.cgkill != nil {
		_ = c.cgkill.Close() // under reg.mu's write lock: no Signal is using it
	}
}
