package spawn

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
)

// childCgroup creates a child cgroup of a fresh test parent and returns
// it opened O_PATH, as the receiver passes it, with its path.
func childCgroup(t *testing.T, name string) (*os.File, string) {
	t.Helper()
	dir := filepath.Join(cgrouptest.Parent(t), name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, dir
}

// startIn starts argv in the cgroup cg with a fresh working directory.
func startIn(t *testing.T, mode Mode, cg *os.File, argv ...string) (*Child, chan []byte) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := workDir(t)
	c, err := Start(Spec{Mode: mode, Path: argv[0], Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir,
		UID: uid, GID: gid, Groups: groups, Output: w, Cgroup: cg})
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("Start %v: %v", argv, err)
	}
	out := make(chan []byte, 1)
	go func() {
		b, _ := readAll(r)
		r.Close()
		out <- b
	}()
	return c, out
}

// TestCgroupFromFirstInstruction: the child is in its cgroup when it
// starts executing (clone3 CLONE_INTO_CGROUP), not moved there later; in
// helper mode the command inherits the helper's cgroup.
func TestCgroupFromFirstInstruction(t *testing.T) {
	testenv.Require(t, "root")
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			cg, dir := childCgroup(t, "t-first")
			c, out := startIn(t, mode, cg, "/bin/cat", "/proc/self/cgroup")
			c.Reap()
			got := string(<-out)
			if want := "0::" + cgrouptest.Rel(t, dir) + "\n"; !strings.Contains(got, want) {
				t.Fatalf("/proc/self/cgroup of the child:\n%s\nwant the line %q", got, want)
			}
			if st := c.Status(); st != (Status{}) {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// Scripts whose background processes leave the command's process group
// (setsid) before the leader goes on: the marker file is created after
// setsid, and the leader waits for it, so the group kill cannot race the
// escape. Each leaves two escaped sleepers.
var escapeScripts = map[string]string{
	"setsid-sleep":  `setsid sh -c 'touch escaped; exec sleep 100' & setsid sleep 100 & while [ ! -e escaped ]; do :; done`,
	"setsid-nested": `setsid sh -c "sleep 100 & touch escaped; sleep 100" & while [ ! -e escaped ]; do :; done`,
}

// TestCgroupKillsEscapees attacks the process-group kill with descendants
// that call setsid: with a cgroup, the leader's exit (the reaper's kill)
// and Kill each leave no process of the uid; without the cgroup kill the
// escapees would sleep on as the grant's user.
func TestCgroupKillsEscapees(t *testing.T) {
	testenv.Require(t, "root")
	for mname, mode := range modes {
		for sname, script := range escapeScripts {
			for _, how := range []string{"leader-exits", "kill"} {
				t.Run(mname+"/"+sname+"/"+how, func(t *testing.T) {
					waitNoUID(t, uid)
					cg, _ := childCgroup(t, "t-escape")
					full := script + "; exit 0"
					if how == "kill" {
						full = script + "; exec sleep 100"
					}
					c, _ := startIn(t, mode, cg, "/bin/sh", "-c", full)
					if how == "kill" {
						waitEscaped(t, c)
						if err := c.Kill(); err != nil {
							t.Fatal(err)
						}
					}
					c.Reap()
					assertNoUIDWithin(t, 10*time.Second)
				})
			}
		}
	}
}

// waitEscaped waits until a process of the uid runs outside the child's
// process group.
func waitEscaped(t *testing.T, c *Child) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for time.Now().Before(deadline) {
		for _, p := range procsOfUID(t, uid) {
			if pg, err := unix.Getpgid(p); err == nil && pg != c.PID() {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Kill()
	t.Fatal("no process left the group: the test did not exercise an escape")
}

// assertNoUIDWithin fails unless every process of the uid is gone within d
// (they were sent SIGKILL; only their exit and reap are asynchronous).
func assertNoUIDWithin(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for countUID(t, uid) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if left := procsOfUID(t, uid); len(left) > 0 {
		t.Fatalf("processes %v of the uid survived the kill", left)
	}
}

// TestCgroupNotACgroup: a Cgroup directory that is not a cgroup (no
// cgroup.kill) is refused before anything is forked.
func TestCgroupNotACgroup(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	dir, _ := workDir(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	_, err = Start(Spec{Path: "/bin/sleep", Argv: []string{"sleep", "100"}, Dir: dir, UID: uid, GID: gid,
		Output: w, Cgroup: dir})
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "cgroup.kill") {
		t.Fatalf("Start with a plain directory as cgroup: %v, want ErrStart naming cgroup.kill", err)
	}
	if ps := procsOfUID(t, uid); len(ps) > 0 {
		t.Fatalf("a refused start left %v", ps)
	}
}
