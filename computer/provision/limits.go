package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
//     (receiver CgroupConfig.V1).

// makeLimitCgroups sets up the cgroups that hold the computer's pids
// and memory limits and records them in the state.
func (c *Local) makeLimitCgroups(ctx context.Context) error {
	if !c.state.namespaced() {
		return nil
	}
	l := c.state.Resources
	if c.state.CgroupParent != "" && cgroup2.HasControllers(c.cgroupMount, "pids", "memory") == nil {
		return cgroup2.SetLimits(c.state.CgroupParent, l.MaxPids, l.MaxMemoryBytes)
	}
	for _, ctrl := range []string{cgroupv1.Pids, cgroupv1.Memory} {
		own, err := cgroupv1.Dir(ctrl)
		if err == nil {
			err = cgroupv1.Check(own, ctrl)
		}
		if err != nil {
			return fmt.Errorf("%w: neither cgroup2 nor a cgroup v1 hierarchy can limit the computer's %s: %w", ErrOptions, ctrl, err)
		}
		dir := filepath.Join(own, CgroupParentName(c.state.Tuple.Sandbox))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("create the computer's %s cgroup: %w", ctrl, err)
		}
		c.mu.Lock()
		c.state.LimitCgroups = append(c.state.LimitCgroups, dir)
		c.mu.Unlock()
		if err := c.saveState(ctx); err != nil {
			return err
		}
		if err := makeV1Computer(dir, ctrl, l.MaxPids, l.MaxMemoryBytes); err != nil {
			return err
		}
	}
	return nil
}

// makeV1Computer makes receiver/ and commands/ in the computer's v1
// cgroup dir of ctrl and sets commands/'s limit.
func makeV1Computer(dir, ctrl string, pids, memory int64) error {
	for _, sub := range []string{"receiver", "commands"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("create the computer's %s cgroup %s: %w", ctrl, sub, err)
		}
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
