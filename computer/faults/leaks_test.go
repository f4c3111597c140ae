package faults

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/provision"
)

// cgroupRoot is where the cgroup hierarchies are mounted (v1 ones and
// the v2 one, at /sys/fs/cgroup itself or at unified).
const cgroupRoot = "/sys/fs/cgroup"

// seen is every computer the daemon made in one state directory, as its
// state file (computer.json) said the last time it was read: the uid, the
// sandbox that names its cgroups, its cgroups, disk and directory. The
// daemon writes the file before it makes the uid's processes, the
// cgroups or the disk, so a scan before a kill knows all they could be.
type seen struct {
	state string
	mu    sync.Mutex
	byDir map[string]provision.State
}

func newSeen(state string) *seen { return &seen{state: state, byDir: map[string]provision.State{}} }

// scan reads every state file now in the state directory.
func (s *seen) scan() {
	for _, sub := range []string{"computers", "pool"} {
		ents, _ := os.ReadDir(filepath.Join(s.state, sub))
		for _, m := range ents {
			st, err := provision.ReadState(filepath.Join(s.state, sub, m.Name()))
			if err != nil {
				continue // not written yet, or gone
			}
			s.mu.Lock()
			s.byDir[st.Dir] = st
			s.mu.Unlock()
		}
	}
}

func (s *seen) all() []provision.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]provision.State, 0, len(s.byDir))
	for _, st := range s.byDir {
		out = append(out, st)
	}
	return out
}

// bySandbox returns the state of the computer whose tuple names sandbox.
func (s *seen) bySandbox(sandbox string) (provision.State, bool) {
	for _, st := range s.all() {
		if st.Tuple.Sandbox == sandbox {
			return st, true
		}
	}
	return provision.State{}, false
}

// cgroupsNamed walks every cgroup hierarchy and returns, for each
// sandbox in want (every sandbox, when want is nil), the cgroups named
// for it (tether-<sandbox>).
func cgroupsNamed(want map[string]bool) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(cgroupRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name, ok := strings.CutPrefix(d.Name(), "tether-"); ok {
			if want == nil || want[name] {
				out[name] = append(out[name], p)
			}
			return fs.SkipDir // a computer's command cgroups are inside
		}
		if strings.Count(p, "/") > 8 {
			return fs.SkipDir
		}
		return nil
	})
	return out, err
}

// loopsUnder returns the loop devices whose backing file lies beneath
// dir.
func loopsUnder(dir string) ([]string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if strings.HasPrefix(backing, dir+"/") {
			out = append(out, strings.Split(f, "/")[3]+" backs "+backing)
		}
	}
	return out, nil
}

// mountsUnder returns the mount points beneath dir in this mount
// namespace.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// leaks lists what is left on the host of the computers seen that are
// not in live (directories of computers that run): their uid's
// processes and System V IPC objects, their cgroups, loop devices and
// mounts, their directory (provision.NothingLeft); and, found by name
// rather than from the state files, every cgroup named for one of them,
// every loop device backed by a file and every mount beneath the state
// directory outside a live computer's directory.
func leaks(s *seen, live map[string]bool) []string {
	s.scan()
	var out []string
	dead := map[string]bool{}
	for _, st := range s.all() {
		if live[st.Dir] {
			continue
		}
		dead[st.Tuple.Sandbox] = true
		if err := provision.NothingLeft(st); err != nil {
			out = append(out, fmt.Sprintf("%s (uid %d): %v", st.Dir, st.UID, err))
		}
	}
	cgs, err := cgroupsNamed(dead)
	if err != nil {
		out = append(out, "walk cgroups: "+err.Error())
	}
	for sb, ps := range cgs {
		out = append(out, fmt.Sprintf("cgroups of ended sandbox %s: %v", sb, ps))
	}
	loops, err := loopsUnder(s.state)
	out = append(out, outside(loops, live, err)...)
	mounts, err := mountsUnder(s.state)
	return append(out, outside(mounts, live, err)...)
}

// outside returns the entries that name no path beneath a live
// directory, and err.
func outside(entries []string, live map[string]bool, err error) []string {
	var out []string
	if err != nil {
		out = append(out, err.Error())
	}
next:
	for _, e := range entries {
		for d := range live {
			if strings.Contains(e, d+"/") {
				continue next
			}
		}
		out = append(out, e)
	}
	return out
}

// checkNothingLeft fails the test with every leak (leaks).
func checkNothingLeft(t *testing.T, s *seen, live map[string]bool) {
	t.Helper()
	for _, l := range leaks(s, live) {
		t.Errorf("left behind: %s", l)
	}
}
