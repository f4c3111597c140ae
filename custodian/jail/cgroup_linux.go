package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/receiver/cgroup2"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// cgroupDrain bounds how long the removal of a killed jail's cgroup
// waits for it to empty (SIGKILLed processes exit at once unless stuck in
// the kernel).
const cgroupDrain = 10 * time.Second

// agentCgroup is the jail's own cgroup, named cgroupName(uid), made by
// root (0755: the agent cannot write its limits) under the jail's uid
// lock. On a cgroup2 mount that offers the memory and pids controllers to
// its children it is one directory there, and bwrap is cloned straight
// into it (CLONE_INTO_CGROUP). Otherwise (a hybrid host) it is one
// directory beneath this process's own cgroup in each of the v1 memory
// and pids hierarchies, and the jail's spawning thread joins them for the
// fork (join, then back). Either way bwrap and everything under it run
// in it from their first instruction. remove kills and removes it.
type agentCgroup struct {
	v2   string   // the cgroup2 directory; "" on v1
	v2fd *os.File // O_PATH of v2, for CLONE_INTO_CGROUP
	v1   []string // the v1 directories: memory, pids
	join []*os.File
	back []*os.File // the tasks files of this process's own v1 cgroups
}

// v1Base is this process's own cgroup in one v1 hierarchy.
type v1Base struct{ controller, own string }

// cgroupBases finds where jail cgroups go: the cgroup2 mount when it
// offers memory and pids to its children, else this process's own
// cgroups in the v1 memory and pids hierarchies (each checked with a
// probe child). Neither is ErrCgroup, naming both failed checks and the
// opt-out.
func cgroupBases() (string, []v1Base, error) {
	mount, errV2 := cgroup2.Mount()
	if errV2 == nil {
		if errV2 = cgroup2.HasControllers(mount, "pids", "memory"); errV2 == nil {
			return mount, nil, nil
		}
	}
	var bases []v1Base
	var errs []error
	for _, c := range []string{cgroupv1.Memory, cgroupv1.Pids} {
		own, err := cgroupv1.Dir(c)
		if err == nil {
			err = cgroupv1.Check(own, c)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bases = append(bases, v1Base{c, own})
	}
	if err := errors.Join(errs...); err != nil {
		return "", nil, fmt.Errorf("%w: neither cgroup2 (%v) nor cgroup v1 (%w) can hold the jail's memory and pids limits; "+
			"set jail.cgroup to %q or pass --jail-cgroup off to run the agent without them", ErrCgroup, errV2, err, CgroupOff)
	}
	return "", bases, nil
}

// makeCgroup makes the cgroup of the jail whose uid lease is held and
// sets its limits; a cgroup of that name left by a killed custodian is
// killed and removed first. On failure nothing is left.
func makeCgroup(ctx context.Context, uid uint32, pids, memory int64) (*agentCgroup, error) {
	v2, bases, err := cgroupBases()
	if err != nil {
		return nil, err
	}
	cg := &agentCgroup{}
	if v2 != "" {
		err = cg.makeV2(ctx, filepath.Join(v2, cgroupName(uid)), pids, memory)
	} else {
		err = cg.makeV1(ctx, bases, uid, pids, memory)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%w: %w", ErrCgroup, err), cg.remove(ctx))
	}
	return cg, nil
}

func (cg *agentCgroup) makeV2(ctx context.Context, dir string, pids, memory int64) error {
	if err := removeV2(ctx, dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("create the jail's cgroup: %w", err)
	}
	cg.v2 = dir
	if err := cgroup2.SetLimits(dir, pids, memory); err != nil {
		return err
	}
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the jail's cgroup: %w", err)
	}
	cg.v2fd = f
	return nil
}

func (cg *agentCgroup) makeV1(ctx context.Context, bases []v1Base, uid uint32, pids, memory int64) error {
	for _, b := range bases {
		dir := filepath.Join(b.own, cgroupName(uid))
		if err := removeV1(ctx, dir); err != nil {
			return err
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("create the jail's %s cgroup: %w", b.controller, err)
		}
		cg.v1 = append(cg.v1, dir)
		if err := cgroupv1.SetLimit(dir, b.controller, pids, memory); err != nil {
			return err
		}
		for _, t := range []struct {
			dir string
			to  *[]*os.File
		}{{dir, &cg.join}, {b.own, &cg.back}} {
			f, err := os.OpenFile(filepath.Join(t.dir, "tasks"), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s/tasks: %w", t.dir, err)
			}
			*t.to = append(*t.to, f)
		}
	}
	return nil
}

// joinV1 moves the calling (locked) thread alone into the jail's v1
// cgroups, so what it forks starts there; backV1 moves it back, so the
// thread, which lives until the agent ends, is not counted in the jail.
func (cg *agentCgroup) joinV1() error {
	for i, f := range cg.join {
		if _, err := unix.Pwrite(int(f.Fd()), []byte("0"), 0); err != nil {
			cg.backV1()
			return fmt.Errorf("%w: join %s: %w", ErrCgroup, cg.v1[i], err)
		}
	}
	return nil
}

func (cg *agentCgroup) backV1() {
	for _, f := range cg.back {
		_, _ = unix.Pwrite(int(f.Fd()), []byte("0"), 0) // a failure leaves only this thread counted in the jail
	}
}

// remove closes the cgroup's files, kills every process still in it and
// removes it. It does nothing on nil; call it once.
func (cg *agentCgroup) remove(ctx context.Context) error {
	if cg == nil {
		return nil
	}
	for _, f := range append(append(cg.join, cg.back...), cg.v2fd) {
		if f != nil {
			f.Close()
		}
	}
	var errs []error
	if cg.v2 != "" {
		errs = append(errs, removeV2(ctx, cg.v2))
	}
	for _, d := range cg.v1 {
		errs = append(errs, removeV1(ctx, d))
	}
	return errors.Join(errs...)
}

// removeV2 kills and removes a cgroup2 directory; a missing one is fine.
func removeV2(ctx context.Context, dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	err := cgroup2.Kill(ctx, dir, cgroupDrain)
	if err == nil {
		err = os.Remove(dir)
	}
	if err != nil {
		return fmt.Errorf("remove the cgroup %s: %w", dir, err)
	}
	return nil
}

// removeV1 kills and removes a v1 cgroup directory; a missing one is
// fine.
func removeV1(ctx context.Context, dir string) error {
	_, err := cgroupv1.Drain(ctx, dir, cgroupDrain)
	if err == nil {
		err = os.Remove(dir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the cgroup %s: %w", dir, err)
	}
	return nil
}

// describe names the cgroup and its limits for the jail's start-up line.
func (cg *agentCgroup) describe(pids, memory int64) string {
	if cg == nil {
		return fmt.Sprintf("no cgroup (jail.cgroup %q, the operator's opt-out): memory unbounded; processes bounded by RLIMIT_NPROC %d only", CgroupOff, pids)
	}
	where := "cgroup2 " + cg.v2
	if cg.v2 == "" {
		where = "cgroup v1 " + strings.Join(cg.v1, " ")
	}
	return fmt.Sprintf("%s: memory %d bytes, no swap; pids %d; RLIMIT_NPROC %d", where, memory, pids, pids)
}

// sweepCgroups kills and removes the jail cgroups killed custodians left
// where this start makes its own: a cgroup named cgroupName(uid) whose
// uid lock is free. The error lists what could not be removed; it does
// not stop the start.
func sweepCgroups(ctx context.Context, lockDir string, own uint32) error {
	if skipSweep {
		return nil
	}
	v2, bases, err := cgroupBases()
	if err != nil {
		return err
	}
	dirs, remove := []string{v2}, removeV2
	if v2 == "" {
		dirs, remove = nil, removeV1
		for _, b := range bases {
			dirs = append(dirs, b.own)
		}
	}
	var errs []error
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			uid, ok := parseCgroupName(e.Name())
			if !ok || uid == own || !e.IsDir() {
				continue
			}
			f, free, err := lockUID(lockDir, uid)
			if err != nil || !free {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, remove(ctx, filepath.Join(d, e.Name())))
			f.Close()
		}
	}
	return errors.Join(errs...)
}
