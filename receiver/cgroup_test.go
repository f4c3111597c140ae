package receiver

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
)

// cgroupParent returns a private cgroup2 parent for one test (removed in
// Cleanup); see cgrouptest.Parent.
func cgroupParent(t *testing.T) string { return cgrouptest.Parent(t) }

// escapeScript leaves a sleeper outside the command's process group
// (setsid) and waits until it has left, then sleeps itself.
const escapeScript = `setsid sh -c 'touch escaped; exec sleep 100' & while [ ! -e escaped ]; do :; done; echo escaped; exec sleep 100`

// TestCgroupKillsEscapees attacks each way a command ends with a
// descendant that called setsid: exec_kill, exec_release, the deadline, a
// revocation, the leader's own exit and the handler's Close. With cgroup containment required
// nothing of the grant uid is left, and the command's cgroup is gone by
// the time the terminal is final. Without cgroup.kill the escaped sleeper
// runs on as the grant's user.
func TestCgroupKillsEscapees(t *testing.T) {
	testenv.Require(t, "root")
	for _, how := range []string{"exec_kill", "exec_release", "deadline", "revocation", "leader_exits", "handler_close"} {
		t.Run(how, func(t *testing.T) {
			parent := cgroupParent(t)
			f := newFixture(t, Options{Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: parent},
				RecheckEvery: 50 * time.Millisecond})
			script, deadline := escapeScript, f.clk.Now().Add(30*time.Second)
			switch how {
			case "leader_exits":
				script = strings.TrimSuffix(script, "; exec sleep 100")
			case "deadline":
				deadline = f.clk.Now().Add(3 * time.Second)
			}
			res, err := f.callCtx(context.Background(), f.grant.Tuple.SHA256(), wire.OpExecStart,
				wire.ExecStartArgs{Argv: []string{"/bin/sh", "-c", script}, Env: map[string]string{"PATH": "/usr/bin:/bin"}}, deadline)
			if err != nil {
				t.Fatal(err)
			}
			st := res.(*wire.ExecStartResult)
			tm := f.h.terms.get(f.grant.Tuple.SHA256(), st.TerminalID)
			if how != "leader_exits" { // that leader ends as soon as the sleeper escaped
				assertInCgroup(t, st.PID, filepath.Join(parent, st.TerminalID))
				waitEscapedFrom(t, st.PID)
				waitOutput(t, tm, "escaped\n") // the leader saw the marker: the escape is complete
			}
			switch how {
			case "exec_kill", "exec_release":
				if _, err := f.call(f.grant, wire.Op(how), wire.TerminalArgs{TerminalID: st.TerminalID}); err != nil {
					t.Fatal(err)
				}
			case "revocation":
				f.publish(f.newGrant("other", allOps...))
			case "handler_close": // the daemon's shutdown: Close returns once every cgroup is removed
				f.h.Close()
				select {
				case <-tm.done:
				default:
					t.Fatal("handler_close: Close returned before the terminal was final")
				}
			}
			select {
			case <-tm.done:
			case <-time.After(30 * time.Second): // a bound for a slow guest, not a wait
				t.Fatalf("%s: the command did not end", how)
			}
			if out, _ := tm.out.Snapshot(true); out != "escaped\n" { // printed after the sleeper's setsid
				t.Fatalf("%s: output %q: the sleeper did not escape first", how, out)
			}
			if _, err := os.Stat(filepath.Join(parent, st.TerminalID)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s: the command's cgroup is still there once the terminal is final: %v", how, err)
			}
			assertNoGrantUID(t)
		})
	}
}

// assertInCgroup checks /proc/pid/cgroup names dir.
func assertInCgroup(t *testing.T, pid int, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if want := "0::" + cgrouptest.Rel(t, dir) + "\n"; !strings.Contains(string(b), want) {
		t.Fatalf("command %d is in\n%s\nwant %q", pid, b, want)
	}
}

// waitEscapedFrom waits until a process of the grant uid runs outside
// the process group pgid.
func waitEscapedFrom(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for time.Now().Before(deadline) {
		for _, p := range procsOfUID(t, gUID) {
			if pg, err := unix.Getpgid(p); err == nil && pg != pgid {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no process left the group: the test did not exercise an escape")
}

// waitOutput waits until the terminal's output is want.
func waitOutput(t *testing.T, tm *terminal, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for time.Now().Before(deadline) {
		if out, _ := tm.out.Snapshot(true); out == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	out, _ := tm.out.Snapshot(true)
	t.Fatalf("output %q, want %q", out, want)
}

// assertNoGrantUID fails unless every process of the grant uid is gone
// within 10 s: they were killed before the terminal became final, only
// the reaping of the escaped ones (by the receiver, their subreaper) is
// asynchronous.
func assertNoGrantUID(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(procsOfUID(t, gUID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ps := procsOfUID(t, gUID); len(ps) > 0 {
		t.Fatalf("processes %v of the grant uid survived", ps)
	}
}

// TestCgroupRequiredRefuses: with cgroup containment required the handler
// refuses to start, naming the failed check, on a parent that is missing,
// that is not on cgroup2 (a plain directory), or that another receiver
// holds; a bad config is refused before that.
func TestCgroupRequiredRefuses(t *testing.T) {
	testenv.Require(t, "root")
	parent := cgroupParent(t)
	held, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: parent}})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cases := map[string]struct {
		parent, check string
	}{
		"missing":       {filepath.Join(t.TempDir(), "nope"), "check parent exists"},
		"not cgroup2":   {t.TempDir(), "check cgroup2 file system"},
		"held by other": {parent, "check parent is this receiver's alone"},
	}
	for name, c := range cases {
		h, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: c.parent}})
		if err == nil {
			h.Close()
			t.Fatalf("%s: a handler started on %s", name, c.parent)
		}
		if !errors.Is(err, ErrCgroup) || !strings.Contains(err.Error(), c.check) {
			t.Errorf("%s: %v, want ErrCgroup naming %q", name, err, c.check)
		}
	}
	for _, bad := range []CgroupConfig{{Mode: CgroupRequired}, {Mode: CgroupRequired, Parent: "rel/x"},
		{Mode: CgroupRequired, Parent: "/sys/fs/cgroup/../x"}, {Mode: "best_effort", Parent: parent}} {
		if _, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: bad}); !errors.Is(err, ErrOptions) {
			t.Errorf("cgroup %+v: %v, want ErrOptions", bad, err)
		}
	}
}

// TestCgroupParentNotRootsAlone attacks the ownership check: a parent,
// an ancestor up to the cgroup2 mount root, or their cgroup.procs or
// cgroup.threads that the grant uid owns (or anyone but root may write)
// would let a command move a setsid escapee out of its cgroup, beyond
// cgroup.kill. The handler refuses to start, naming the check.
func TestCgroupParentNotRootsAlone(t *testing.T) {
	testenv.Require(t, "root")
	chown := func(p string) error { return os.Chown(p, int(gUID), int(gGID)) }
	cases := map[string]struct {
		file   string // beneath the cgroup, "" for the cgroup itself
		up     bool   // attack the parent's parent instead
		change func(string) error
	}{
		"parent chowned":         {change: chown},
		"parent procs chowned":   {file: "cgroup.procs", change: chown},
		"parent threads chowned": {file: "cgroup.threads", change: chown},
		"parent group-writable":  {change: func(p string) error { return os.Chmod(p, 0o775) }},
		"parent procs o+w":       {file: "cgroup.procs", change: func(p string) error { return os.Chmod(p, 0o646) }},
		"ancestor chowned":       {up: true, change: chown},
		"ancestor procs chowned": {up: true, file: "cgroup.procs", change: chown},
		"ancestor threads g+w":   {up: true, file: "cgroup.threads", change: func(p string) error { return os.Chmod(p, 0o664) }},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			outer := cgroupParent(t)
			parent := filepath.Join(outer, "receiver")
			if err := os.Mkdir(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			ok, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: parent}})
			if err != nil {
				t.Fatalf("before the change: %v", err)
			}
			ok.Close()
			target := parent
			if c.up {
				target = outer
			}
			if err := c.change(filepath.Join(target, c.file)); err != nil {
				t.Fatal(err)
			}
			h, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: parent}})
			if err == nil {
				h.Close()
				t.Fatalf("a handler started on %s with %s changed", parent, filepath.Join(target, c.file))
			}
			if !errors.Is(err, ErrCgroup) || !errors.Is(err, errNotRootsAlone) || !strings.Contains(err.Error(), "check parent is root's alone") {
				t.Fatalf("%v, want ErrCgroup naming the check", err)
			}
			if !strings.Contains(err.Error(), filepath.Join(target, c.file)) {
				t.Fatalf("%v does not name %s", err, filepath.Join(target, c.file))
			}
		})
	}
}

// TestCgroupStaleRemovedAtStart: a command cgroup a previous receiver left
// (it was killed before it could remove it) with a process still in it,
// and a left start-up probe, are killed and removed when a handler takes
// the parent; cgroups of other names (someone else's, or near misses of
// the terminal id format) are left alone.
func TestCgroupStaleRemovedAtStart(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, gUID)
	parent := cgroupParent(t)
	stale := filepath.Join(parent, newTerminalID())
	probe := filepath.Join(parent, newProbeName())
	hex32 := strings.Repeat("0123456789abcdef", 2)
	others := []string{"t-foo.service", "t-" + strings.ToUpper(hex32), "t-" + hex32 + "0", "t-" + hex32[:31],
		"probe-xyz", "probe-" + hex32, "probe-0123456789ABCDEF", "x-" + hex32}
	for _, d := range append([]string{filepath.Base(stale), filepath.Base(probe)}, others...) {
		if err := os.Mkdir(filepath.Join(parent, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := os.OpenFile(stale, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	dir, err := os.OpenFile("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	// Setsid then sleep: a process out of the leader's group, as an
	// escaped descendant of a killed receiver's command would be.
	c, err := spawn.Start(spawn.Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", "setsid sleep 100 & exec sleep 100"},
		Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir, UID: gUID, GID: gGID, Output: null, Cgroup: cg})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(Options{Grants: lyingSource{}, Cgroup: CgroupConfig{Mode: CgroupRequired, Parent: parent}})
	if err != nil {
		c.Kill()
		t.Fatal(err)
	}
	defer h.Close()
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second): // a bound for a slow guest, not a wait
		c.Kill()
		t.Fatal("the process in the stale cgroup was not killed")
	}
	for _, d := range []string{stale, probe} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale cgroup %s still there: %v", filepath.Base(d), err)
		}
	}
	for _, d := range others {
		if _, err := os.Stat(filepath.Join(parent, d)); err != nil {
			t.Errorf("cgroup %s that is not a command's was touched: %v", d, err)
		}
	}
	assertNoGrantUID(t)
}

// TestCgroupCreateRefusedOnceClosing: a command cgroup asked for while the
// parent is being closed (close waits for a live command's cgroup) is
// refused and nothing is made in the parent; close returns once the live
// one is removed. Without the closed flag the late create is counted
// after close began waiting, or made beneath a closed descriptor.
func TestCgroupCreateRefusedOnceClosing(t *testing.T) {
	testenv.Require(t, "root")
	parent := cgroupParent(t)
	cg, err := newCgroups(CgroupConfig{Mode: CgroupRequired, Parent: parent}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	live, err := cg.create(newTerminalID())
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { cg.close(); close(closed) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) { // a bound, not a wait
		cg.mu.Lock()
		c := cg.closed
		cg.mu.Unlock()
		if c {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("close never began")
		}
	}
	late := newTerminalID()
	if tc, err := cg.create(late); !errors.Is(err, ErrCgroup) || !errors.Is(err, errCgroupsClosed) {
		if err == nil {
			cg.remove(tc)
		}
		t.Fatalf("create while closing: %v, want ErrCgroup wrapping errCgroupsClosed", err)
	}
	select {
	case <-closed:
		t.Fatal("close returned while a command cgroup was still live")
	default:
	}
	if err := cg.remove(live); err != nil {
		t.Fatal(err)
	}
	<-closed
	if _, err := cg.create(newTerminalID()); !errors.Is(err, errCgroupsClosed) {
		t.Fatalf("create after close: %v, want errCgroupsClosed", err)
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("%s was left in the parent", e.Name())
		}
	}
}
