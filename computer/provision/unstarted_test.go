package provision

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
)

// TestDestroyUnstarted: a computer whose maker was killed before it
// wrote the state file (New writes it first, alone in DIR) leaves an
// empty directory, or one holding the state file's temporary copy;
// Destroy removes it. The control: a directory holding anything else is
// not a computer's, and Destroy leaves it and names what is there.
func TestDestroyUnstarted(t *testing.T) {
	p := NewProvisioner(Config{})
	for _, tc := range []struct {
		name  string
		files []string
		gone  bool
	}{
		{"empty", nil, true},
		{"state-temp", []string{"computer.json.tmp"}, true},
		{"foreign-file", []string{"notes.txt"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c-1")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := p.Destroy(context.Background(), dir)
			_, statErr := os.Lstat(dir)
			if tc.gone && (err != nil || !errors.Is(statErr, os.ErrNotExist)) {
				t.Fatalf("Destroy = %v; directory: %v; want it removed", err, statErr)
			}
			if !tc.gone && (!errors.Is(err, ErrLeftover) || statErr != nil) {
				t.Fatalf("Destroy = %v; directory: %v; want ErrLeftover and the directory kept", err, statErr)
			}
		})
	}
}

// TestMakeRecordedCgroupWritesAhead: the state file names a computer's
// cgroup before the cgroup exists, so a maker killed in between leaves
// nothing that no state names; a cgroup that exists already is refused
// and not named (a computer never takes over a cgroup it did not make).
func TestMakeRecordedCgroupWritesAhead(t *testing.T) {
	base := t.TempDir()
	c := &Local{paths: layout(filepath.Join(base, "c")), state: State{Version: stateVersion}}
	if err := os.Mkdir(c.paths.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := func() string {
		b, err := os.ReadFile(c.paths.state)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return string(b)
	}
	recordOf := func(dir string) func(*State, bool) {
		return func(s *State, made bool) {
			if made {
				if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the cgroup exists (%v) before the state names it", err)
				}
				s.LimitCgroups = []string{dir}
			} else {
				s.LimitCgroups = nil
			}
		}
	}
	dir := filepath.Join(base, "tether-sandbox")
	if err := c.makeRecordedCgroup(context.Background(), dir, recordOf(dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil || !strings.Contains(names(), dir) {
		t.Fatalf("after makeRecordedCgroup: cgroup %v, state %s", err, names())
	}

	unmakeable := filepath.Join(base, "missing", "tether-x") // recorded, then Mkdir fails
	if err := c.makeRecordedCgroup(context.Background(), unmakeable, recordOf(unmakeable)); err == nil || strings.Contains(names(), unmakeable) {
		t.Fatalf("a cgroup that cannot be made: err %v, state %s", err, names())
	}

	other := filepath.Join(base, "tether-other") // someone else's
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	err := c.makeRecordedCgroup(context.Background(), other, func(s *State, made bool) {
		t.Errorf("an existing cgroup was recorded (made=%v)", made)
	})
	if err == nil || strings.Contains(names(), other) {
		t.Fatalf("an existing cgroup: err %v, state %s", err, names())
	}
}

// TestIntegrationDestroyAfterKilledTeardown: teardown removes the state
// file last, so a teardown killed on the way leaves a directory whose
// state still names the computer, and Destroy finishes the job. Here the
// directory is what is left when the kill comes just before the state
// file's removal: nothing but computer.json. (The opposite, a directory
// of the computer's entries without its state, is refused: the control
// in TestDestroyUnstarted.)
func TestIntegrationDestroyAfterKilledTeardown(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	if last := layout("/c").entries(); last[len(last)-1] != layout("/c").state {
		t.Fatalf("teardown removes %s last, not the state file", last[len(last)-1])
	}
	p := NewProvisioner(Config{Bins: receiverBins(t)})
	ctx := ctxT(t, 2*time.Minute)
	m := prepare(t, p)
	s := m.Local().State()
	state, err := os.ReadFile(layout(s.Dir).state)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := os.Mkdir(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(layout(s.Dir).state, state, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, s.Dir); err != nil {
		t.Fatalf("Destroy of what a killed teardown left: %v", err)
	}
	if err := NothingLeft(s); err != nil {
		t.Fatal(err)
	}
}
