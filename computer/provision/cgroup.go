package provision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/receiver"
	"github.com/tetherdev/tether/receiver/cgroup2"
)

// Cgroup modes; see Options.Cgroup.
const (
	CgroupAuto     = ""
	CgroupRequired = receiver.CgroupRequired
	CgroupOff      = receiver.CgroupOff
)

// CgroupDrain bounds how long teardown waits for a killed parent cgroup
// to empty before it reports it left behind.
const CgroupDrain = 10 * time.Second

// ChooseCgroup resolves the cgroup mode of a computer's receiver:
// CgroupAuto becomes CgroupRequired when check reports the computer can
// contain commands in cgroups (nil), else CgroupOff; CgroupRequired stays
// only if check passes, else it is refused naming the failed check;
// CgroupOff stays; anything else is refused. Errors wrap ErrOptions.
func ChooseCgroup(mode string, check func() error) (string, error) {
	switch mode {
	case CgroupAuto:
		if check() == nil {
			return CgroupRequired, nil
		}
		return CgroupOff, nil
	case CgroupRequired:
		if err := check(); err != nil {
			return "", fmt.Errorf("%w: cgroup %q: %w", ErrOptions, CgroupRequired, err)
		}
		return CgroupRequired, nil
	case CgroupOff:
		return CgroupOff, nil
	}
	return "", fmt.Errorf("%w: cgroup %q is not %q, %q or empty (auto)", ErrOptions, mode, CgroupRequired, CgroupOff)
}

// CgroupParentName is the name of a computer's parent cgroup in the
// cgroup2 mount: "tether-" and the tuple's sandbox.
func CgroupParentName(sandbox string) string { return "tether-" + sandbox }

// MakeCgroupParent creates the computer's parent cgroup
// <mount>/tether-<sandbox>, root's and 0755 (the grant's uid can neither
// write its files nor create cgroups in it). It refuses one that exists:
// a computer never takes over a cgroup it did not make. RemoveCgroup
// removes it.
func MakeCgroupParent(mount, sandbox string) (string, error) {
	p := filepath.Join(mount, CgroupParentName(sandbox))
	if err := os.Mkdir(p, 0o755); err != nil {
		return "", fmt.Errorf("create the parent cgroup: %w", err)
	}
	return p, nil
}

// makeRecordedCgroup makes the cgroup directory dir (root's, 0755) after
// the state file names it (record(s, true), saved): a maker killed in
// between leaves a state naming a cgroup that teardown finds absent,
// never a cgroup that no state names. It refuses a dir that exists (a
// computer never takes over a cgroup it did not make), and takes dir out
// of the state again (record(s, false)) when it cannot make it.
func (c *Local) makeRecordedCgroup(ctx context.Context, dir string, record func(s *State, made bool)) error {
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s exists, or cannot be checked: %v", dir, err)
	}
	c.mu.Lock()
	record(&c.state, true)
	c.mu.Unlock()
	if err := c.saveState(ctx); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		c.mu.Lock()
		record(&c.state, false)
		c.mu.Unlock()
		return errors.Join(err, c.saveState(ctx))
	}
	return nil
}

// RemoveCgroup kills every process in the cgroup tree at parent
// (cgroup.kill), waits until it is empty (at most CgroupDrain, woken by
// cgroup.events) and removes its child cgroups, deepest first, then
// parent. Call it after the receiver stopped: the receiver removes each
// command's cgroup itself, so a child cgroup still there is reported
// (ErrLeftover) after it is removed. A parent that cannot be removed is
// reported (ErrLeftover) and named; one that does not exist is not.
func RemoveCgroup(ctx context.Context, parent string) error {
	if err := cgroup2.IsCgroup2(parent); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("%w: parent cgroup %s left in place: %w", ErrLeftover, parent, err)
	}
	children, err := cgroupChildren(parent)
	if err == nil {
		err = cgroup2.Kill(ctx, parent, CgroupDrain)
	}
	for i := len(children) - 1; i >= 0 && err == nil; i-- {
		err = os.Remove(children[i])
	}
	if err == nil {
		err = os.Remove(parent)
	}
	if err != nil {
		return fmt.Errorf("%w: parent cgroup %s not removed: %w", ErrLeftover, parent, err)
	}
	if len(children) > 0 {
		return fmt.Errorf("%w: cgroups outlived the receiver and were killed and removed: %s",
			ErrLeftover, strings.Join(children, ", "))
	}
	return nil
}

// removeCommandCgroups kills and removes the command cgroups (t- and
// 32 lowercase hex digits) a receiver that was killed left in parent:
// expected then, so not reported; anything else in parent is left to
// RemoveCgroup, which reports it.
func removeCommandCgroups(ctx context.Context, parent string) error {
	ents, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: list %s: %w", ErrLeftover, parent, err)
	}
	var errs []error
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "t-")
		if !e.IsDir() || !ok || len(rest) != 32 || strings.Trim(rest, "0123456789abcdef") != "" {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		err := cgroup2.Kill(ctx, dir, CgroupDrain)
		if err == nil {
			err = os.Remove(dir)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: command cgroup %s left by the killed receiver: %w", ErrLeftover, dir, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupChildren lists the cgroups beneath parent, each after its own
// parent (so removing them in reverse removes the deepest first).
func cgroupChildren(parent string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != parent {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}
