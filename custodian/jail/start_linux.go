package jail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Process is one jailed agent. Write ACP to Stdin and read it from Stdout;
// close Stdin to ask the agent to end, read Stdout to EOF, then close it.
// Wait must be called: it is what empties HOME and /tmp, kills and
// removes the jail's cgroup and releases its uid.
type Process struct {
	// Stdin and Stdout are the agent's ACP stream; the caller closes both.
	Stdin  io.WriteCloser
	Stdout io.ReadCloser

	spec    *Spec // the caller's spec with the leased uid and gid
	lease   *uidLease
	cg      *agentCgroup // nil with jail.cgroup off
	cmd     *exec.Cmd
	scratch string
	child   []*os.File // the child's ends and data descriptors, closed after start
	done    chan struct{}
	waitErr error
	cleanup error
	// stderr is the caller's, serialized (lockedWriter).
	stderr io.Writer
	// egressLn is the proxy's listener in the jail's network namespace
	// until Attach takes it; attached says Detach is owed (NetworkProxy).
	egressLn net.Listener
	attached bool
}

// Start checks the machine (Check), leases the jail's own uid, sweeps
// what jails of killed custodians left, makes the jail's cgroup and starts
// spec's agent in the jail. stderr receives the jail's start-up lines,
// its refusals and the agent's own stderr. Nothing is started (and
// nothing is left) when an error is returned.
func Start(spec *Spec, stderr io.Writer) (*Process, error) {
	if err := Check(spec); err != nil {
		return nil, err
	}
	lease, err := acquireUID(spec)
	if err != nil {
		return nil, err
	}
	s := *spec
	s.UID, s.GID = lease.uid, lease.gid
	stderr = &lockedWriter{w: stderr}
	p := &Process{spec: &s, lease: lease, done: make(chan struct{}), stderr: stderr}
	if err := p.prepare(stderr); err != nil {
		p.closeChild()
		err = errors.Join(err, p.cg.remove(context.Background()))
		if p.scratch != "" {
			os.Remove(p.scratch)
		}
		lease.release()
		return nil, err
	}
	started := make(chan error, 1)
	go p.run(started)
	if err := <-started; err != nil {
		p.Stdin.Close()
		p.Stdout.Close()
		return nil, err
	}
	return p, nil
}

// prepare sweeps, makes the cgroup and the scratch directory, and builds
// the command. What it made is recorded in p for Start to undo.
func (p *Process) prepare(stderr io.Writer) error {
	s := p.spec
	if err := sweepScratch(s.ScratchParent, s.LockDir, s.UID); err != nil {
		fmt.Fprintf(stderr, "tether jail: sweep: %v\n", err)
	}
	if s.Cgroup != CgroupOff {
		if err := sweepCgroups(context.Background(), s.LockDir, s.UID); err != nil {
			fmt.Fprintf(stderr, "tether jail: sweep: %v\n", err)
		}
		cg, err := makeCgroup(context.Background(), s.UID, s.MaxPids, s.MaxMemory)
		if err != nil {
			return err
		}
		p.cg = cg
	}
	s.bounds = p.bounds()
	scratch, err := os.MkdirTemp(s.ScratchParent, scratchPattern(s.UID))
	if err != nil {
		return fmt.Errorf("%w: make the scratch directory: %w", ErrStart, err)
	}
	p.scratch = scratch
	return p.command(stderr)
}

// bounds is the jail's start-up line about its uid, cgroup and limits.
func (p *Process) bounds() string {
	s := p.spec
	uid := fmt.Sprintf("own uid %d (drawn from jail.uid_range %d-%d, held while the jail runs)", s.UID, s.UIDs.First, s.UIDs.Last)
	if s.Pinned {
		uid = fmt.Sprintf("uid %d pinned by jail.uid (held while the jail runs)", s.UID)
	}
	serve := "; network " + s.Network + ": the agent may serve only on the jail's own loopback"
	switch {
	case s.Network == NetworkHost && skipServeBounds:
		serve = "; network host: serving on the host is NOT refused (a test's positive control)"
	case s.Network == NetworkHost && s.Listen:
		serve = fmt.Sprintf("; network host: TCP bind refused (Landlock ABI %d), Multipath TCP and io_uring refused (seccomp), "+
			"listen allowed for the plugin's socket (a TCP listen without bind would get an ephemeral port), connect allowed", LandlockABI())
	case s.Network == NetworkHost:
		serve = fmt.Sprintf("; network host: TCP bind refused (Landlock ABI %d), listen, Multipath TCP and io_uring refused (seccomp), connect allowed", LandlockABI())
	}
	return uid + "; " + p.cg.describe(s.MaxPids, s.MaxMemory) + serve
}

// skipServeBounds, set only by tests, leaves out the TCP bind rule and
// the seccomp filter under network host: the positive control that shows
// the agent serves on the host without them.
var skipServeBounds bool

// command builds bwrap's exec.Cmd with the agent's pipes and the data
// descriptors (the init's spec, /etc/passwd, /etc/group).
func (p *Process) command(stderr io.Writer) error {
	s := p.spec
	spec, err := json.Marshal(initSpec{Path: s.Path, Argv: s.Argv, Exec: s.execAllowed(), Banner: s.Banner(), NProc: s.MaxPids,
		DenyServe: s.Network == NetworkHost && !skipServeBounds, AllowListen: s.Listen})
	if err != nil {
		return fmt.Errorf("%w: encode the init's spec: %w", ErrStart, err)
	}
	var data [3]*os.File
	for i, d := range []string{string(spec), s.passwd(), s.group()} {
		if data[i], err = memFile("tether-jail-data", d); err != nil {
			p.child = append(p.child, data[:i]...)
			return err
		}
	}
	p.child = append(p.child, data[:]...)
	inR, inW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("%w: stdin pipe: %w", ErrStart, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return fmt.Errorf("%w: stdout pipe: %w", ErrStart, err)
	}
	p.Stdin, p.Stdout = inW, outR
	p.child = append(p.child, inR, outW)
	cmd := exec.Command(s.Bwrap, bwrapArgs(s, filepath.Join(p.scratch, "home"), filepath.Join(p.scratch, "tmp"))...)
	cmd.Env, cmd.Dir = s.Env, "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, stderr
	cmd.ExtraFiles = data[:] // initSpecFD, passwdFD, groupFD
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL,
		Credential: &syscall.Credential{Uid: s.UID, Gid: s.GID, Groups: []uint32{}}}
	if p.cg != nil && p.cg.v2fd != nil { // clone3 with CLONE_INTO_CGROUP: bwrap never runs outside the jail's cgroup
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(p.cg.v2fd.Fd())
	}
	p.cmd = cmd
	return nil
}

// memFile is an anonymous file holding data, positioned at its start.
func memFile(name, data string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd: %w", ErrStart, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: write memfd: %w", ErrStart, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: seek memfd: %w", ErrStart, err)
	}
	return f, nil
}

func (p *Process) closeChild() {
	for _, f := range p.child {
		f.Close()
	}
	p.child = nil
}

// run is the jail's own OS thread: it gets a private mount namespace with
// the tmpfs for HOME and /tmp, starts bwrap from it, waits for the agent
// and empties the tmpfs.
//
// WARNING: thread-sensitive. The goroutine locks its OS thread and never
// unlocks it: the thread's mount namespace, no_new_privs and bounding set
// differ from the process's, bwrap inherits them, and the thread's exit is
// what delivers bwrap's parent-death signal. When the goroutine returns
// while locked, the runtime destroys the thread, so nothing leaks into the
// custodian. Tested as root by
//
//	go test -race -run 'TestIntegrationJail' ./custodian/jail/
func (p *Process) run(started chan<- error) {
	runtime.LockOSThread()
	err := p.prepareThread()
	if err == nil && p.spec.Network == NetworkProxy {
		err = p.attachEgress()
	}
	if err == nil {
		err = p.startInCgroup()
	}
	p.closeChild()
	if err != nil {
		p.end()
		started <- errors.Join(err, p.cleanup)
		return
	}
	started <- nil
	p.waitErr = p.cmd.Wait()
	p.end()
}

// startInCgroup starts bwrap in the jail's cgroup: cloned into it on
// cgroup2 (SysProcAttr.CgroupFD), forked by this thread while it is in
// the v1 cgroups.
func (p *Process) startInCgroup() error {
	if p.cg != nil {
		if err := p.cg.joinV1(); err != nil {
			return err
		}
		defer p.cg.backV1()
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("%w: execute %s: %w", ErrStart, p.spec.Bwrap, err)
	}
	return nil
}

// end empties HOME and /tmp, kills and removes the jail's cgroup, then
// releases the uid, and marks the jail done.
func (p *Process) end() {
	p.cleanup = errors.Join(p.detachEgress(), p.empty())
	if err := p.cg.remove(context.Background()); err != nil {
		p.cleanup = errors.Join(p.cleanup, fmt.Errorf("%w: %w", ErrCleanup, err))
	}
	p.lease.release()
	close(p.done)
}

// prepareThread unshares the thread's mount namespace, mounts the private
// tmpfs (noexec, nosuid, nodev, bounded, owned by the agent) on the
// scratch directory, makes home and tmp in it, under NetworkProxy moves
// the thread into a network namespace of the jail's own with the proxy's
// listener (proxy_linux.go), and sets no_new_privs and an empty bounding
// set for what the thread starts.
func (p *Process) prepareThread() error {
	s := p.spec
	network := func() error { return nil }
	if s.Network == NetworkProxy {
		network = p.enterNetwork
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"unshare the mount namespace", func() error { return unix.Unshare(unix.CLONE_NEWNS) }},
		{"make mounts private to the jail", func() error { return unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, "") }},
		{"mount the private tmpfs", func() error {
			opts := fmt.Sprintf("mode=0700,uid=%d,gid=%d,size=%d", s.UID, s.GID, s.TmpSize)
			return unix.Mount("tether-jail", p.scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts)
		}},
		{"make HOME and /tmp", p.makeDirs},
		{"make the jail's network namespace", network},
		{"set no_new_privs", func() error { return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }},
		{"drop the bounding set", dropBoundingSet},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrStart, st.name, err)
		}
	}
	return nil
}

func (p *Process) makeDirs() error {
	for _, d := range []string{"home", "tmp"} {
		path := filepath.Join(p.scratch, d)
		if err := os.Mkdir(path, 0o700); err != nil {
			return err
		}
		if err := os.Chown(path, int(p.spec.UID), int(p.spec.GID)); err != nil {
			return err
		}
	}
	return nil
}

// dropBoundingSet empties the calling thread's capability bounding set.
func dropBoundingSet() error {
	data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return err
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("cap_last_cap: %w", err)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

// empty removes everything in HOME and /tmp, checks that both are empty,
// unmounts the tmpfs and removes the scratch directory. It runs on the
// jail's thread, the only one besides the jail that sees the tmpfs.
func (p *Process) empty() error {
	var errs []error
	for _, d := range []string{"home", "tmp"} {
		if err := emptyDir(filepath.Join(p.scratch, d)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unix.Unmount(p.scratch, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("unmount: %w", err))
	}
	if err := os.Remove(p.scratch); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrCleanup, err)
	}
	return nil
}

// emptyDir removes every entry of dir (a missing dir is empty) and checks
// that none is left.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%s still holds %d entries", dir, len(left))
	}
	return nil
}

// Pid is bwrap's process id (the jail's outermost process, on the host).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill ends the jail at once: bwrap is killed, and with it (its
// parent-death signal, then the end of its pid namespace) every process
// in the jail. Wait still has to be called.
func (p *Process) Kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Terminate asks the agent to end: SIGTERM to every process of the
// agent's session inside the jail (the agent and what it started, which
// may clean up), not to bwrap, whose death would only SIGKILL them. It
// does nothing once the jail ended. Kill remains the last resort.
func (p *Process) Terminate() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	leader, err := sessionLeader(p.cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSignal, err)
	}
	if err := unix.Kill(-leader, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%w: SIGTERM to the agent's process group %d: %w", ErrSignal, leader, err)
	}
	return nil
}

// sessionLeader finds the jail's session leader: bwrap's child, which is
// pid 1 of the jail's pid namespace and, with --new-session, the leader of
// the session and process group the agent runs in. As the namespace's
// init it ignores SIGTERM from outside; the agent below it does not.
func sessionLeader(bwrap int) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, pgrp, err := parentAndGroup(pid)
		if err == nil && ppid == bwrap && pgrp == pid {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no session leader below bwrap (pid %d): the jail is not running", bwrap)
}

// parentAndGroup reads a process's parent and process group from
// /proc/PID/stat (the fields after the command name, which may itself
// hold spaces and parentheses).
func parentAndGroup(pid int) (ppid, pgrp int, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseStat(data)
}

// parseStat reads the ppid and pgrp fields of a /proc/PID/stat line.
func parseStat(data []byte) (ppid, pgrp int, err error) {
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 3 {
		return 0, 0, fmt.Errorf("stat: %d fields after the command name, want at least 3", len(f))
	}
	if ppid, err = strconv.Atoi(f[1]); err == nil {
		pgrp, err = strconv.Atoi(f[2])
	}
	if err != nil {
		return 0, 0, fmt.Errorf("stat: %w", err)
	}
	return ppid, pgrp, nil
}

// Wait waits for the agent to end, then empties HOME and /tmp, kills
// what is left in the jail's cgroup and removes it, and releases the
// jail's uid. It returns the agent's exit (an *exec.ExitError for a
// non-zero status) joined with any cleanup failure (ErrCleanup). It may
// be called more than once.
func (p *Process) Wait() error {
	<-p.done
	return errors.Join(p.waitErr, p.cleanup)
}

// execAllowed is every jail path the init allows to execute: the
// agent's program and interpreters, the configured helpers, the init
// itself and the shell stubs (both are this binary).
func (s *Spec) execAllowed() []string {
	var out []string
	for _, v := range s.Exec {
		out = append(out, v.Dest)
	}
	out = append(out, InitPath)
	return append(out, s.Stubs...)
}
