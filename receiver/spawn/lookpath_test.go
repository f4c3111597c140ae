package spawn

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

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
