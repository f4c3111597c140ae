package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoFreezer: the computer's commands are in no cgroup that can be
// frozen (no cgroup2 parent and no v1 freezer hierarchy on this host).
var ErrNoFreezer = errors.New("computer: no cgroup freezer holds the computer's commands")

// freezer is the one file that freezes a computer's commands, and the
// words it takes: cgroup2's cgroup.freeze on the parent of the command
// cgroups ("1", "0", confirmed by cgroup.events "frozen 1"), or the v1
// freezer.state of the commands/ cgroup ("FROZEN", "THAWED", which it
// reads back once the change is complete). Neither holds the receiver,
// so it keeps answering while its commands are frozen.
type freezer struct {
	file           string // cgroup.freeze or freezer.state
	done           string // the file read to confirm: cgroup.events or freezer.state
	freeze, thaw   string // what is written
	frozen, thawed string // what done reads once complete
}

// freezer chooses what the computer's cgroups offer: cgroup2 when its
// commands are in a cgroup2 parent, else the v1 freezer hierarchy.
func (s State) freezer() (freezer, error) {
	if s.CgroupParent != "" {
		f := filepath.Join(s.CgroupParent, "cgroup.freeze")
		if _, err := os.Lstat(f); err == nil {
			return freezer{file: f, done: filepath.Join(s.CgroupParent, "cgroup.events"),
				freeze: "1", thaw: "0", frozen: "frozen 1", thawed: "frozen 0"}, nil
		}
	}
	if d := s.v1Commands("freezer.state"); d != "" {
		f := filepath.Join(d, "freezer.state")
		return freezer{file: f, done: f, freeze: "FROZEN", thaw: "THAWED", frozen: "FROZEN", thawed: "THAWED"}, nil
	}
	return freezer{}, ErrNoFreezer
}

// v1Commands returns the commands/ cgroup of the computer's v1
// hierarchy whose commands/ has file (for example freezer.state), or ""
// when none has.
func (s State) v1Commands(file string) string {
	for _, d := range s.LimitCgroups {
		c := filepath.Join(d, "commands")
		if _, err := os.Lstat(filepath.Join(c, file)); err == nil {
			return c
		}
	}
	return ""
}

// setFrozen freezes (or thaws) the computer's commands and returns once
// the kernel reports the change complete, or ctx ends.
func (s State) setFrozen(ctx context.Context, frozen bool) error {
	f, err := s.freezer()
	if err != nil {
		return err
	}
	word, want := f.thaw, f.thawed
	if frozen {
		word, want = f.freeze, f.frozen
	}
	if err := os.WriteFile(f.file, []byte(word), 0); err != nil {
		return fmt.Errorf("computer: write %q to %s: %w", word, f.file, err)
	}
	for {
		b, err := os.ReadFile(f.done)
		if err != nil {
			return fmt.Errorf("computer: read %s: %w", f.done, err)
		}
		if hasLine(string(b), want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("computer: %s never read %q: %w", f.done, want, context.Cause(ctx))
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// isFrozen reports whether the computer's commands are frozen or being
// frozen (false when it has no freezer).
func (s State) isFrozen() bool {
	f, err := s.freezer()
	if err != nil {
		return false
	}
	b, err := os.ReadFile(f.file)
	return err == nil && strings.TrimSpace(string(b)) != f.thaw
}

// hasLine reports whether text holds line as one whole line.
func hasLine(text, line string) bool {
	for l := range strings.Lines(text) {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// Freeze stops every command of the computer (cgroup freezer) and
// returns once all are frozen; the receiver keeps answering. A command
// started while frozen starts frozen. It fails with ErrNoFreezer on a
// computer whose commands no freezer holds.
func (c *Local) Freeze(ctx context.Context) error { return c.State().setFrozen(ctx, true) }

// Thaw lets the computer's commands run again.
func (c *Local) Thaw(ctx context.Context) error { return c.State().setFrozen(ctx, false) }

// Frozen reports whether the computer's commands are frozen.
func (c *Local) Frozen() bool { return c.State().isFrozen() }
