package spawn

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Start starts one child as described by spec and returns once it runs
// (or failed to start, in which case no child exists). It is the only
// function that starts children. The child is reaped by the package's
// reaper or by Child.Reap; wait on Child.Done or call Child.Reap.
//
// The spawning thread is a fresh goroutine's, unless spec.OnCallingThread
// says to use the caller's: see there for what the caller then owes.
func Start(spec Spec) (*Child, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	devNull, err := openDevNull()
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrStart, os.DevNull, err)
	}
	startReaper()
	c := &Child{done: make(chan struct{})}
	// cgroup.kill is opened here, before any thread is restricted (Landlock
	// would refuse the open on a prepared spawning thread).
	if c.cgkill, err = openCgroupKill(spec.Cgroup); err != nil {
		return nil, err
	}
	if spec.OnCallingThread {
		// WARNING: thread-sensitive. The calling goroutine is locked to its
		// OS thread here and never unlocked (the caller must not call
		// UnlockOSThread on this goroutine): launch restricts this thread
		// and forks from it. The caller keeps the goroutine until the child
		// is reaped, then lets it end, and the runtime destroys the thread.
		// Tested as root by
		//   go test -race -run 'TestChildMasks|TestNoLeak|TestPdeathsig|TestOnCallingThread' ./receiver/spawn/
		runtime.LockOSThread()
		if err := c.launch(&spec, devNull); err != nil {
			c.closeCgroupKill()
			return nil, err
		}
		return c, nil
	}
	started := make(chan error, 1)
	// WARNING: order- and thread-sensitive. The goroutine locks its OS
	// thread and never unlocks it: prepareThread changes attributes of that
	// thread only (fs context, bounding set, inheritable and ambient sets,
	// no_new_privs, Landlock, seccomp filter), the child inherits them, and the thread's
	// exit is what delivers the child's parent-death signal. When the
	// goroutine returns while locked, the runtime destroys the thread, so
	// no restriction leaks into the receiver. Tested as root by
	//   go test -race -run 'TestChildMasks|TestNoLeak|TestPdeathsig|TestSeccomp' ./receiver/spawn/
	go func() {
		runtime.LockOSThread()
		err := c.launch(&spec, devNull)
		started <- err
		if err != nil {
			return
		}
		<-c.done // keep the thread, and so the parent-death signal, until the child is reaped
	}()
	if err := <-started; err != nil {
		c.closeCgroupKill()
		return nil, err
	}
	return c, nil
}

// openCgroupKill opens cgroup.kill of the child's cgroup for writing, or
// returns nil without a cgroup.
func openCgroupKill(cg *os.File) (*os.File, error) {
	if cg == nil {
		return nil, nil
	}
	fd, err := unix.Openat(int(cg.Fd()), "cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open cgroup.kill of the child's cgroup: %w", ErrStart, err)
	}
	return os.NewFile(uintptr(fd), "cgroup.kill"), nil
}

// closeCgroupKill closes cgroup.kill of a child that never started (a
// started child closes it when it is reaped).
func (c *Child) closeCgroupKill() {
	if c.cgkill != nil {
		_ = c.cgkill.Close()
	}
}

// launch runs on the locked spawning thread: it prepares the thread (in
// ModeThread), forks the child and registers it with the reaper before the
// reaper can see it exit.
func (c *Child) launch(spec *Spec, devNull *os.File) error {
	if err := checkThreadCaps(); err != nil {
		return err
	}
	if !filepath.IsAbs(spec.Path) {
		resolved, err := lookPathAs(spec)
		if err != nil {
			return err
		}
		s := *spec
		s.Path = resolved
		spec = &s
	}
	if spec.Mode == ModeClone {
		return c.launchClone(spec, devNull)
	}
	attr, err := procAttr(spec, devNull)
	if err != nil {
		return err
	}
	if spec.Mode == ModeThread {
		if err := prepareThread(spec, true); err != nil {
			return fmt.Errorf("%w: prepare spawning thread: %w", ErrStart, err)
		}
	}
	path, argv := spec.Path, spec.Argv
	var helper *helperLaunch
	if spec.Mode == ModeHelper {
		if helper, err = newHelperLaunch(spec, attr); err != nil {
			return err
		}
		defer helper.close()
		path, argv = helper.exe, []string{helper.exe, HelperArg}
	}
	if err := joinV1(spec.CgroupsV1); err != nil {
		return err
	}
	reg.mu.RLock()
	p, err := os.StartProcess(path, argv, attr)
	if err == nil {
		c.pid = p.Pid
		c.pidfd = openPidfd(p.Pid) // the child cannot be reaped before reg.mu is released
		register(c)
		_ = p.Release() // the reaper waits by pid; drop os's pidfd
	}
	reg.mu.RUnlock()
	backV1(spec.CgroupsV1)
	if err != nil {
		return fmt.Errorf("%w: execute %s: %w", ErrStart, spec.Path, err)
	}
	wakeReaper()
	if helper != nil {
		return helper.finish(c)
	}
	return nil
}

// launchClone prepares the spawning thread as ModeThread does, except
// for the seccomp filter, which the child installs on itself, and forks
// the child with cloneChild.
func (c *Child) launchClone(spec *Spec, devNull *os.File) error {
	if err := prepareThread(spec, false); err != nil {
		return fmt.Errorf("%w: prepare spawning thread: %w", ErrStart, err)
	}
	if err := joinV1(spec.CgroupsV1); err != nil {
		return err
	}
	err := c.cloneChild(spec, devNull)
	backV1(spec.CgroupsV1)
	return err
}

// joinV1 moves the calling (locked, spawning) thread alone into every
// Join cgroup; on a failure it moves it back and nothing is forked.
func joinV1(cgs []CgroupV1) error {
	for i, cg := range cgs {
		if _, err := unix.Pwrite(int(cg.Join.Fd()), []byte("0"), 0); err != nil {
			backV1(cgs[:i])
			return fmt.Errorf("%w: join the cgroup v1 %s: %w", ErrStart, cg.Join.Name(), err)
		}
	}
	return nil
}

// backV1 moves the calling thread back into the receiver's own cgroups.
// A failure only leaves this thread, which ends with the child, counted
// in the computer's cgroup; the child is there either way.
func backV1(cgs []CgroupV1) {
	for _, cg := range cgs {
		_, _ = unix.Pwrite(int(cg.Back.Fd()), []byte("0"), 0)
	}
}

// procAttr builds the fork attributes: stdin /dev/null, stdout and stderr
// the output, a new session (and so a new process group), SIGKILL on the
// death of this thread, the child's cgroup if any, and in ModeThread the
// grant's credentials. Env is
// never nil, so nothing is inherited.
func procAttr(spec *Spec, devNull *os.File) (*os.ProcAttr, error) {
	env := append([]string{}, spec.Env...)
	sys := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if spec.Cgroup != nil { // clone3 with CLONE_INTO_CGROUP: no instant outside the cgroup
		sys.UseCgroupFD, sys.CgroupFD = true, int(spec.Cgroup.Fd())
	}
	if spec.Mode == ModeThread {
		groups := append([]uint32{}, spec.Groups...)
		sys.Credential = &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: groups}
	} else {
		env = []string{}
	}
	return &os.ProcAttr{Env: env, Files: []*os.File{devNull, spec.Output, spec.Output}, Sys: sys}, nil
}

// prepareThread restricts the calling (locked) thread so that a child
// forked from it inherits exactly: its own working directory and umask
// 022, an empty bounding set, empty inheritable and ambient sets,
// no_new_privs, the Landlock ruleset if any, and the seccomp filter if
// any (only when filter is set: ModeClone's child installs it itself).
// The effective and permitted sets stay, because the fork still needs
// SETUID and SETGID; the child's setuid and execve clear them.
func prepareThread(spec *Spec, filter bool) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare CLONE_FS: %w", err)
	}
	if err := unix.Fchdir(int(spec.Dir.Fd())); err != nil {
		return fmt.Errorf("fchdir to the working directory: %w", err)
	}
	unix.Umask(0o022)
	if err := restrictSelf(spec.Landlock); err != nil {
		return err
	}
	if filter && spec.Seccomp != nil { // last: the fork and the child's exec run under it
		return spec.Seccomp.installThread()
	}
	return nil
}

// restrictSelf is the part of the restriction shared with the helper:
// bounding set, inheritable and ambient sets, no_new_privs, Landlock.
func restrictSelf(rs *Ruleset) error {
	if err := dropBoundingSet(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	if err := clearInheritable(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if rs != nil {
		if err := rs.restrictThread(); err != nil {
			return err
		}
	}
	return nil
}

// dropBoundingSet drops every capability the kernel knows from the
// calling thread's bounding set (this is what SETPCAP is kept for). Each
// drop commits new credentials, so only capabilities still in the set are
// dropped: seven in the narrowed receiver.
func dropBoundingSet() error {
	for c := 0; c <= lastCap(); c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			continue // the kernel does not know this capability
		}
		if err != nil {
			return fmt.Errorf("read capability %d of the bounding set: %w", c, err)
		}
		if in == 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// clearInheritable empties the calling thread's inheritable set and
// leaves its effective and permitted sets alone.
func clearInheritable() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear the inheritable set: %w", err)
	}
	return nil
}
