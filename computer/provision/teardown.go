package provision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Close implements Computer. It is safe to call twice; the second call
// returns the first one's result.
func (c *Local) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.teardown(ctx) })
	return c.closeErr
}

// teardown ends a frozen computer's commands (thawToEnd), stops the
// receiver (on a namespaced computer the kernel then kills everything
// else in its PID namespace, and its mount and IPC namespaces go with the
// last process), kills and removes its parent cgroup (with
// CgroupRequired), kills and reports anything still running as the
// grant's uid, removes the computer's limit cgroups, unmounts the tuple
// root's bind and the disk (releasing the loop device), removes and
// reports System V IPC objects of the grant's uid left in this namespace,
// removes every entry the computer made in DIR and then DIR itself.
// Entries someone else put in DIR are left and named.
func (c *Local) teardown(ctx context.Context) error {
	if c.paths.dir == "" {
		return nil // validate failed: nothing was made
	}
	var errs []error
	if err := c.thawToEnd(ctx); err != nil {
		errs = append(errs, err)
	}
	died, err := c.stopReceiver(ctx) // killed before teardown: it could not remove its command cgroups
	if err != nil {
		errs = append(errs, fmt.Errorf("stop receiver: %w", err))
	}
	if c.state.CgroupParent != "" {
		if died {
			errs = append(errs, removeCommandCgroups(ctx, c.state.CgroupParent))
		}
		if err := RemoveCgroup(ctx, c.state.CgroupParent); err != nil {
			errs = append(errs, err)
		}
	}
	if c.state.UID >= MinID {
		if err := killLeftovers(ctx, c.state.UID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeLimitCgroups(ctx, c.state.LimitCgroups); err != nil {
		errs = append(errs, err)
	}
	if err := removeDisk(ctx, c.paths, c.state.Disk); err != nil {
		errs = append(errs, err)
	}
	if c.state.UID >= MinID {
		if err := removeIPC(c.state.UID); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, RemoveDir(c.paths.dir, c.paths.entries()...))
	return errors.Join(errs...)
}

// thawToEnd lets a frozen computer end: it sends SIGKILL to every
// process of the grant's uid while they are still frozen, then thaws
// them, so they die without running again and the receiver (whose
// spawning thread may wait in a frozen v1 cgroup) can stop.
func (c *Local) thawToEnd(ctx context.Context) error {
	s := c.State()
	if !s.isFrozen() {
		return nil
	}
	if s.UID >= MinID {
		ps, _ := ProcessesOf(s.UID)
		for _, p := range ps {
			_ = syscall.Kill(p.HostPID, syscall.SIGKILL)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, CgroupDrain)
	defer cancel()
	return s.setFrozen(ctx, false)
}

// RemoveDir removes a computer's directory: first the entries the
// computer made in it, then dir itself. Entries someone else put in dir
// are left in place, and the error (ErrLeftover) names them.
func RemoveDir(dir string, entries ...string) error {
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(e); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		names, _ := readNames(dir)
		errs = append(errs, fmt.Errorf("%w: %s still holds %s, which the computer did not make; left in place",
			ErrLeftover, dir, strings.Join(names, ", ")))
	}
	return errors.Join(errs...)
}

// killLeftovers kills every process still running as uid and reports
// them: after the receiver stopped, its children must already be gone.
// It kills again on every pass until none is left (a leftover may fork
// between the listing and the kill), and reports any that survive the
// bound.
func killLeftovers(ctx context.Context, uid uint32) error {
	if used, err := uidInUse(uid); err != nil || !used {
		return err
	}
	procs, err := ProcessesOf(uid)
	if err != nil || len(procs) == 0 {
		return err
	}
	var desc []string
	for _, p := range procs {
		desc = append(desc, fmt.Sprintf("%d (%s)", p.HostPID, p.Comm))
	}
	deadline := time.Now().Add(5 * time.Second)
	for rest := procs; len(rest) > 0; rest, _ = ProcessesOf(uid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: processes of uid %d outlived the receiver and survive SIGKILL: %d left",
				ErrLeftover, uid, len(rest))
		}
		for _, p := range rest {
			_ = syscall.Kill(p.HostPID, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%w: processes of uid %d outlived the receiver and were killed: %s",
		ErrLeftover, uid, strings.Join(desc, ", "))
}

func readNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

// absClean makes dir absolute and resolves symlinks above it.
func absClean(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotComputer, err)
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// Stat implements Computer, confined beneath the root by os.Root.
func (c *Local) Stat(ctx context.Context, rel string) (FileInfo, error) {
	r, err := os.OpenRoot(c.paths.root)
	if err != nil {
		return FileInfo{}, err
	}
	defer r.Close()
	fi, err := r.Lstat(relOrDot(rel))
	if err != nil {
		return FileInfo{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return FileInfo{Name: fi.Name(), Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, Size: fi.Size()}, nil
}

// ReadFile implements Computer, confined beneath the root by os.Root.
func (c *Local) ReadFile(ctx context.Context, rel string) ([]byte, error) {
	r, err := os.OpenRoot(c.paths.root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadFile(rel)
}

// Processes implements Computer: the processes of the grant's uid, with
// pids as the computer sees them.
func (c *Local) Processes(ctx context.Context) ([]Process, error) {
	all, err := AllProcesses()
	if err != nil {
		return nil, err
	}
	var mine []Process
	for _, p := range all {
		if p.UID == c.state.UID {
			mine = append(mine, p)
		}
	}
	return innerView(mine, all), nil
}

func relOrDot(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}
