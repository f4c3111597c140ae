package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tetherdev/tether/receiver"
	"github.com/tetherdev/tether/receiver/cgroup2"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// A namespaced computer's processes and memory are bounded where the
// commands run, never where the receiver runs (a command that exhausts
// them must not starve the receiver of threads or memory):
//
//   - cgroup2 with the pids and memory controllers: the limits are
//     written on the parent cgroup of the command cgroups
//     (pids.max, memory.max, memory.swap.max 0);
//   - a hybrid host (cgroup2 without them): in each v1 hierarchy, beneath
//     this process's own cgroup, a computer cgroup tether-<sandbox> with
//     two children: receiver/ (the stage moves itself there, and so the
//     receiver) and commands/ (pids.max; memory.limit_in_bytes and
//     memory.memsw.limit_in_bytes equal, so no swap, and swappiness 0).
//     The receiver's spawning thread joins commands/ for each fork
//     (receiver CgroupConfig.V1). Without a cgroup2 parent the v1
//     freezer and cpuacct hierarchies get the same pair, so that Freeze
//     stops the commands alone and Usage reads their CPU time.

// makeLimitCgroups sets up the cgroups that hold the computer's pids
// and memory limits, and those of its freezer and CPU reading where
// cgroup2 cannot hold them (v1Extras), and records them in the state.
func (c *Local) makeLimitCgroups(ctx context.Context) error {
	if !c.State().namespaced() { // a copy: Prepare changes other fields meanwhile
		return nil
	}
	l := c.state.Resources
	if c.state.CgroupParent != "" && cgroup2.HasControllers(c.cgroupMount, "pids", "memory") == nil {
		if err := cgroup2.SetLimits(c.state.CgroupParent, l.MaxPids, l.MaxMemoryBytes); err != nil {
			return err
		}
	} else {
		for _, ctrl := range []string{cgroupv1.Pids, cgroupv1.Memory} {
			if err := c.makeV1Hierarchy(ctx, ctrl); err != nil {
				return err
			}
		}
	}
	for _, ctrl := range c.v1Extras() {
		if err := c.makeV1Hierarchy(ctx, ctrl); err != nil {
			return err
		}
	}
	return nil
}

// v1Extras are the v1 hierarchies the computer's commands also go in:
// with a cgroup2 parent, none (its cgroup.freeze and cpu.stat serve);
// without one, freezer and cpuacct where this host mounts them. A host
// with neither gives a computer that cannot be frozen (ErrNoFreezer).
func (c *Local) v1Extras() []string {
	if c.state.CgroupParent != "" {
		return nil
	}
	var out []string
	for _, ctrl := range []string{cgroupv1.Freezer, cgroupv1.Cpuacct} {
		if own, err := cgroupv1.Dir(ctrl); err == nil && cgroupv1.Check(own, ctrl) == nil {
			out = append(out, ctrl)
		}
	}
	return out
}

// makeV1Hierarchy makes the computer's cgroup tether-<sandbox> in this
// process's own cgroup of ctrl's v1 hierarchy, records it, and makes its
// receiver/ and commands/ children.
func (c *Local) makeV1Hierarchy(ctx context.Context, ctrl string) error {
	l := c.state.Resources
	own, err := cgroupv1.Dir(ctrl)
	if err == nil {
		err = cgroupv1.Check(own, ctrl)
	}
	if err != nil {
		return fmt.Errorf("%w: neither cgroup2 nor a cgroup v1 hierarchy can limit the computer's %s: %w", ErrOptions, ctrl, err)
	}
	dir := filepath.Join(own, CgroupParentName(c.state.Tuple.Sandbox))
	err = c.makeRecordedCgroup(ctx, dir, func(s *State, made bool) {
		if made {
			s.LimitCgroups = append(s.LimitCgroups, dir)
		} else {
			s.LimitCgroups = slices.DeleteFunc(s.LimitCgroups, func(d string) bool { return d == dir })
		}
	})
	if err != nil {
		return fmt.Errorf("create the computer's %s cgroup: %w", ctrl, err)
	}
	return makeV1Computer(dir, ctrl, l.MaxPids, l.MaxMemoryBytes)
}

// makeV1Computer makes receiver/ and commands/ in the computer's v1
// cgroup dir of ctrl and sets commands/'s limit.
func makeV1Computer(dir, ctrl string, pids, memory int64) error {
	for _, sub := range []string{"receiver", "commands"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("create the computer's %s cgroup %s: %w", ctrl, sub, err)
		}
	}
	if ctrl != cgroupv1.Pids && ctrl != cgroupv1.Memory {
		return nil // freezer and cpuacct: nothing to limit
	}
	return cgroupv1.SetLimit(filepath.Join(dir, "commands"), ctrl, pids, memory)
}

// cgroupV1Config is the receiver's CgroupConfig.V1 for the computer's
// v1 cgroups.
func (s State) cgroupV1Config() []receiver.CgroupV1Config {
	var out []receiver.CgroupV1Config
	for _, d := range s.LimitCgroups {
		out = append(out, receiver.CgroupV1Config{Commands: filepath.Join(d, "commands"), Receiver: filepath.Join(d, "receiver")})
	}
	return out
}

// removeLimitCgroups kills whatever is still in the computer's v1
// cgroups and removes them, children first. A command still in
// commands/ after the receiver stopped is reported (ErrLeftover); the
// receiver's own cgroup may still list the receiver while it finishes
// exiting, which is only waited for.
func removeLimitCgroups(ctx context.Context, dirs []string) error {
	var errs, left []error
	for _, d := range dirs {
		for _, sub := range []string{filepath.Join(d, "commands"), filepath.Join(d, "receiver"), d} {
			n, err := cgroupv1.Drain(ctx, sub, CgroupDrain)
			if n > 0 && filepath.Base(sub) != "receiver" {
				left = append(left, fmt.Errorf("%d processes in %s", n, sub))
			}
			if err == nil {
				err = os.Remove(sub)
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("%w: cgroup %s not removed: %w", ErrLeftover, sub, err))
			}
		}
	}
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("%w: processes outlived the receiver in its cgroups and were killed: %w", ErrLeftover, errors.Join(left...)))
	}
	return errors.Join(errs...)
}
