package spawn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/caps"
)

// lookupTree builds directories a PATH lookup must see as the child's user
// (uid, gid, groups[0]) sees them; every tool is a shell script that exits 0
// (not a copy of /bin/true, which is a busybox link in the CI guest):
//
//	hidden/  0700 root     tool-hidden 0755, tool-both 0755
//	open/    0755 root     tool-open 0755, tool-both 0755, tool-noexec 0644,
//	                       tool-rootonly 0700, tool-dir/ (a directory)
//	group/   0710 root:g   tool-group 0750 root:g (g = the child's first supplementary group)
func lookupTree(t *testing.T) (hidden, open, group string) {
	t.Helper()
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := []byte("#!/bin/sh\nexit 0\n")
	mk := func(dir string, mode os.FileMode, files map[string]os.FileMode, g int) string {
		d := filepath.Join(base, dir)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, m := range files {
			p := filepath.Join(d, name)
			if err := os.WriteFile(p, bin, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 0, g); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, m); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(d, 0, g); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	hidden = mk("hidden", 0o700, map[string]os.FileMode{"tool-hidden": 0o755, "tool-both": 0o755}, 0)
	open = mk("open", 0o755, map[string]os.FileMode{"tool-open": 0o755, "tool-both": 0o755,
		"tool-noexec": 0o644, "tool-rootonly": 0o700}, 0)
	if err := os.Mkdir(filepath.Join(open, "tool-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	group = mk("group", 0o710, map[string]os.FileMode{"tool-group": 0o750}, int(groups[0]))
	return hidden, open, group
}

// TestLookPathAsChild attacks the PATH lookup: a file in a 0700 root
// directory exists (root sees it) but must be answered exactly like a
// missing one; files the child cannot execute are skipped; access through
// the child's supplementary group works, so the lookup really runs with
// the child's uid, gid and groups, not as root and not as "other".
func TestLookPathAsChild(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	hidden, open, group := lookupTree(t)
	if _, err := os.Stat(filepath.Join(hidden, "tool-hidden")); err != nil {
		t.Fatalf("the hidden file must exist for the attack to mean anything: %v", err)
	}
	search := []string{hidden, open, group}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			dir, _ := workDir(t)
			try := func(cmd string) (*Child, error) {
				_, w, _ := os.Pipe()
				defer w.Close()
				return Start(Spec{Mode: mode, Path: cmd, Search: search, Argv: []string{cmd}, Env: []string{},
					Dir: dir, Output: w, UID: uid, GID: gid, Groups: groups})
			}
			notFound := map[string]string{}
			for _, cmd := range []string{"tool-hidden", "tool-absent", "tool-noexec", "tool-rootonly", "tool-dir"} {
				c, err := try(cmd)
				if !errors.Is(err, ErrNotFound) || c != nil {
					t.Fatalf("%s: Start = %v, %v; want ErrNotFound", cmd, c, err)
				}
				notFound[cmd] = strings.ReplaceAll(err.Error(), cmd, "CMD")
			}
			if notFound["tool-hidden"] != notFound["tool-absent"] {
				t.Fatalf("a hidden file is told apart from a missing one:\n%s\n%s", notFound["tool-hidden"], notFound["tool-absent"])
			}
			for cmd, wantDir := range map[string]string{"tool-open": open, "tool-both": open, "tool-group": group} {
				c, err := try(cmd)
				if err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
				<-c.Done()
				if st := c.Status(); st != (Status{Code: 0}) {
					t.Fatalf("%s (want it from %s): status %+v", cmd, wantDir, st)
				}
			}
			if ps := procsOfUID(t, uid); len(ps) > 0 {
				t.Fatalf("refused lookups left processes %v", ps)
			}
		})
	}
	assertThreadsRoot(t)
}

// TestLookPathResolvesFirstMatch: the lookup returns the first directory
// (in Search order) where the child can execute the name.
func TestLookPathResolvesFirstMatch(t *testing.T) {
	testenv.Require(t, "root")
	hidden, open, _ := lookupTree(t)
	spec := &Spec{Path: "tool-both", Search: []string{hidden, open}, UID: uid, GID: gid, Groups: groups}
	got := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, as in Start
		p, err := lookPathAs(spec)
		errc <- err
		got <- p
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if p := <-got; p != filepath.Join(open, "tool-both") {
		t.Fatalf("resolved %q, want the copy in %s (the one in %s is hidden from uid %d)", p, open, hidden, uid)
	}
	assertThreadsRoot(t)
}

// assertThreadsRoot: after lookups every thread of this process still has
// root's ids (fsuid included) and the groups it started with.
func assertThreadsRoot(t *testing.T) {
	t.Helper()
	want, err := caps.ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	sts, err := caps.ThreadStatuses(0)
	if err != nil {
		t.Fatal(err)
	}
	for tid, st := range sts {
		if st.UID != [4]uint32{} || st.GID != [4]uint32{} || fmt.Sprint(st.Groups) != fmt.Sprint(want.Groups) {
			t.Errorf("thread %d: Uid %v Gid %v Groups %v after lookups", tid, st.UID, st.GID, st.Groups)
		}
	}
}

// TestLookPathInsideLandlockView attacks the lookup with a directory the
// child can search and execute in by its permissions, but that its
// Landlock ruleset (the root's view) leaves out: a name found only there is
// not found, exactly like a missing one, and a name in both resolves to
// the copy the child can execute. Without the view check the first would
// fail at exec with EACCES (a different answer) and the second would run
// nothing. The kernel agrees: executing the left-out copy by absolute path
// is refused.
func TestLookPathInsideLandlockView(t *testing.T) {
	testenv.Require(t, "root")
	if LandlockABI() < MinLandlockABI {
		t.Fatalf("kernel Landlock ABI %d < %d: this machine cannot prove the control", LandlockABI(), MinLandlockABI)
	}
	waitNoUID(t, uid)
	_, open, _ := lookupTree(t)
	outside := filepath.Join(filepath.Dir(open), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tool-both", "tool-view"} {
		if err := os.WriteFile(filepath.Join(outside, name), []byte("#!/bin/sh\nexit 7\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rs := viewRuleset(t, open)
	search := []string{outside, open}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			dir, _ := workDir(t)
			try := func(cmd string) (*Child, error) {
				_, w, _ := os.Pipe()
				defer w.Close()
				return Start(Spec{Mode: mode, Path: cmd, Search: search, Argv: []string{cmd}, Env: []string{},
					Dir: dir, Output: w, UID: uid, GID: gid, Groups: groups, Landlock: rs})
			}
			if c, err := try("tool-view"); !errors.Is(err, ErrNotFound) || c != nil {
				t.Fatalf("a name only outside the view: Start = %v, %v; want ErrNotFound", c, err)
			}
			c, err := try("tool-both")
			if err != nil {
				t.Fatalf("tool-both: %v (want the copy in %s)", err, open)
			}
			<-c.Done()
			if st := c.Status(); st != (Status{Code: 0}) {
				t.Fatalf("tool-both ran %+v; the copy inside the view exits 0, the one outside 7", st)
			}
			if c, err := try(filepath.Join(outside, "tool-view")); err == nil {
				<-c.Done()
				t.Fatalf("the kernel executed a file outside the view: %+v", c.Status())
			}
		})
	}
	assertThreadsRoot(t)
}

// viewRuleset is testRuleset's system view plus dir, read and execute.
func viewRuleset(t *testing.T, dir string) *Ruleset {
	t.Helper()
	var rules []Rule
	for p, a := range map[string]Access{"/usr": AccessReadExec, "/bin": AccessReadExec, "/lib": AccessReadExec,
		"/lib64": AccessReadExec, "/etc": AccessReadExec, "/dev/null": AccessReadWriteFile, dir: AccessReadExec} {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		rules = append(rules, Rule{File: f, Access: a})
	}
	rs, err := NewRuleset(rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs
}
