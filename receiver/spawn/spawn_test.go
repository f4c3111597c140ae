package spawn

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/fixtures/testids"
	"github.com/tetherdev/tether/receiver/caps"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperArg {
		HelperMain()
	}
	ids := testids.MustForTree("TETHER_SPAWN_TEST_IDS", 4) // noKillMain's process checks the same uid
	uid, gid, groups = ids[0], ids[1], ids[2:]
	slices.Sort(groups) // as the kernel lists them in /proc/PID/status
	if os.Getenv(noKillEnv) != "" {
		noKillMain()
	}
	os.Exit(m.Run())
}

// The child's ids are this test process's own (fixtures/testids), set by
// TestMain: tests count, wait for and kill every process of uid, which
// another test binary running at the same time must never add to or lose.
var (
	uid, gid uint32
	groups   []uint32
)

// modes are the spawn modes every mode test runs: ModeClone where it is
// supported (TestCloneSupported fails where it should be and is not).
var modes = func() map[string]Mode {
	m := map[string]Mode{"thread": ModeThread, "helper": ModeHelper}
	if CloneSupported() == nil {
		m["clone"] = ModeClone
	}
	return m
}()

// workDir returns a directory the test uid can use, opened O_PATH.
func workDir(t testing.TB) (*os.File, string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir makes both 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, dir
}

// run starts argv in mode and returns its output and status.
func run(t testing.TB, mode Mode, rs *Ruleset, argv ...string) (string, Status) {
	t.Helper()
	dir, _ := workDir(t)
	c, out, err := start(mode, dir, rs, []string{"PATH=/usr/bin:/bin"}, argv...)
	if err != nil {
		t.Fatalf("Start %v: %v", argv, err)
	}
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		c.Kill()
		t.Fatalf("%v did not exit", argv)
	}
	return string(<-out), c.Status()
}

// start starts argv and returns the child and a channel with its output.
func start(mode Mode, dir *os.File, rs *Ruleset, env []string, argv ...string) (*Child, chan []byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	c, err := Start(Spec{Mode: mode, Path: argv[0], Argv: argv, Env: env, Dir: dir,
		UID: uid, GID: gid, Groups: groups, Output: w, Landlock: rs})
	w.Close()
	out := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		out <- b
	}()
	return c, out, err
}

// TestChildMasks proves a child's and a grandchild's identity and
// privileges exactly, runc style, in both modes.
func TestChildMasks(t *testing.T) {
	testenv.Require(t, "root")
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			out, st := run(t, mode, nil, "/bin/sh", "-c", "cat /proc/self/status; echo @@@; /bin/sh -c 'cat /proc/self/status'")
			if st != (Status{Code: 0}) {
				t.Fatalf("status %+v, output %s", st, out)
			}
			parts := strings.Split(out, "@@@\n")
			if len(parts) != 2 {
				t.Fatalf("output %q", out)
			}
			for i, p := range parts {
				assertUnprivileged(t, []string{"child", "grandchild"}[i], p)
			}
		})
	}
}

func assertUnprivileged(t *testing.T, who, status string) {
	t.Helper()
	st, err := caps.ParseStatus([]byte(status))
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	if st.UID != [4]uint32{uid, uid, uid, uid} || st.GID != [4]uint32{gid, gid, gid, gid} || !reflect.DeepEqual(st.Groups, groups) {
		t.Fatalf("%s: Uid %v Gid %v Groups %v, want %d %d %v", who, st.UID, st.GID, st.Groups, uid, gid, groups)
	}
	masks := map[string]uint64{"CapInh": st.CapInh, "CapPrm": st.CapPrm, "CapEff": st.CapEff, "CapBnd": st.CapBnd, "CapAmb": st.CapAmb}
	for k, v := range masks {
		if v != 0 {
			t.Errorf("%s: %s = %016x, want 0000000000000000", who, k, v)
		}
	}
	if st.NoNewPrivs != 1 {
		t.Errorf("%s: NoNewPrivs = %d, want 1", who, st.NoNewPrivs)
	}
}

// TestSessionGroupEnvCwd: own session and group, environment from nothing,
// working directory and umask from the spawning thread.
func TestSessionGroupEnvCwd(t *testing.T) {
	testenv.Require(t, "root")
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			dir, path := workDir(t)
			c, out, err := start(mode, dir, nil, []string{"A=1", "PATH=/usr/bin:/bin"},
				"/bin/sh", "-c", `echo "$$ $(cut -d' ' -f5,6 /proc/self/stat)"; pwd; umask; env | sort`)
			if err != nil {
				t.Fatal(err)
			}
			<-c.Done()
			lines := strings.Split(strings.TrimSpace(string(<-out)), "\n")
			p := strconv.Itoa(c.PID())
			want := []string{p + " " + p + " " + p, path, "0022", "A=1", "PATH=/usr/bin:/bin", "PWD=" + path}
			if !reflect.DeepEqual(lines, want) {
				t.Fatalf("got %q\nwant %q", lines, want)
			}
		})
	}
}

func TestExitStatus(t *testing.T) {
	testenv.Require(t, "root")
	if _, st := run(t, ModeThread, nil, "/bin/sh", "-c", "exit 7"); st != (Status{Code: 7}) {
		t.Fatalf("exit 7: %+v", st)
	}
	if _, st := run(t, ModeThread, nil, "/bin/sh", "-c", "kill -TERM $$"); st != (Status{Code: -1, Signal: syscall.SIGTERM}) {
		t.Fatalf("kill -TERM $$: %+v", st)
	}
}

func TestStartRefuses(t *testing.T) {
	testenv.Require(t, "root")
	dir, _ := workDir(t)
	_, w, _ := os.Pipe()
	defer w.Close()
	base := Spec{Path: "/bin/true", Argv: []string{"true"}, Dir: dir, Output: w, UID: uid, GID: gid}
	cases := map[string]struct {
		mut  func(*Spec)
		want error
	}{
		"uid 0":      {func(s *Spec) { s.UID = 0 }, ErrSpec},
		"gid 0":      {func(s *Spec) { s.GID = 0 }, ErrSpec},
		"group 0":    {func(s *Spec) { s.Groups = []uint32{0} }, ErrSpec},
		"relative":   {func(s *Spec) { s.Path = "./true" }, ErrSpec},
		"dot":        {func(s *Spec) { s.Path = ".." }, ErrSpec},
		"no search":  {func(s *Spec) { s.Path = "true" }, ErrNotFound},
		"search rel": {func(s *Spec) { s.Path, s.Search = "true", []string{"bin"} }, ErrSpec},
		"LD_PRELOAD": {func(s *Spec) { s.Env = []string{"LD_PRELOAD=/tmp/x.so"} }, ErrLoaderEnv},
		"LD_AUDIT":   {func(s *Spec) { s.Env = []string{"LD_AUDIT=x"} }, ErrLoaderEnv},
		"GCONV_PATH": {func(s *Spec) { s.Env = []string{"GCONV_PATH=/tmp"} }, ErrLoaderEnv},
		"no equals":  {func(s *Spec) { s.Env = []string{"A"} }, ErrSpec},
		"duplicate":  {func(s *Spec) { s.Env = []string{"A=1", "A=2"} }, ErrSpec},
		"missing":    {func(s *Spec) { s.Path = "/nonexistent/tether" }, ErrStart},
		"not exec":   {func(s *Spec) { s.Path = "/etc/hostname" }, ErrStart},
	}
	waitNoUID(t, uid)
	for name, c := range cases {
		s := base
		c.mut(&s)
		if ch, err := Start(s); !errors.Is(err, c.want) || ch != nil {
			t.Errorf("%s: Start = %v, %v; want %v", name, ch, err, c.want)
		}
	}
	if ps := procsOfUID(t, uid); len(ps) > 0 {
		t.Fatalf("refused starts left processes %v of uid %d", ps, uid)
	}
}

// procsOfUID lists the processes whose real uid is u, zombies included.
func procsOfUID(t testing.TB, u uint32) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := caps.ReadStatus(fmt.Sprintf("/proc/%d/status", pid))
		if err == nil && st.UID[0] == u {
			out = append(out, pid)
		}
	}
	return out
}

func countUID(t testing.TB, u uint32) int { return len(procsOfUID(t, u)) }

// waitNoUID waits until no process of uid u is left from earlier tests.
func waitNoUID(t testing.TB, u uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for countUID(t, u) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of uid %d left by earlier tests", procsOfUID(t, u), u)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKillTree kills a shell with two sleepers and a double-forked
// sleeper (reparented, still in the group) and requires all of them gone
// from /proc within 100 ms.
func TestKillTree(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	dir, _ := workDir(t)
	c, _, err := start(ModeThread, dir, nil, nil, "/bin/sh", "-c", "sleep 100 & sleep 100 & (sleep 100 &); exec sleep 100")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killUID(t, c, uid) }) // no sleeper outlives a failure here
	tree := settledTree(t, uid, c.PID(), 4)
	t.Logf("settled tree: %v", tree)
	start := time.Now()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	for time.Since(start) < 100*time.Millisecond && countUID(t, uid) > 0 {
		time.Sleep(time.Millisecond)
	}
	if left := procsOfUID(t, uid); len(left) > 0 {
		t.Fatalf("after 100 ms, processes %v of the tree remain", left)
	}
	<-c.Done()
	if st := c.Status(); st.Signal != syscall.SIGKILL {
		t.Fatalf("status %+v, want SIGKILL", st)
	}
}

// treeProc is one process of a test uid as /proc shows it.
type treeProc struct {
	PID, PGID   int
	Name, State string
}

// settledTree waits until the processes of uid u are exactly n sleepers
// (comm "sleep", not zombies) in process group pgid: the shell has forked
// every one of them, its subshell has exited and been reaped, and the
// leader has exec'd its own sleep. Until then the tree is still growing
// (a forked child is "sh" until it execs; the subshell is a fifth process
// until it exits), and that is no failure. The bound is for a slow guest;
// the wait ends as soon as the tree is settled.
func settledTree(t *testing.T, u uint32, pgid, n int) []treeProc {
	t.Helper()
	var tree []treeProc
	deadline := time.Now().Add(30 * time.Second)
	for {
		tree = treeOfUID(t, u)
		if treeSettled(tree, pgid, n) {
			return tree
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tree never settled to %d sleepers in group %d: %+v", n, pgid, tree)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func treeSettled(tree []treeProc, pgid, n int) bool {
	if len(tree) != n {
		return false
	}
	for _, p := range tree {
		if p.Name != "sleep" || p.State == "Z" || p.PGID != pgid {
			return false
		}
	}
	return true
}

// treeOfUID reads each process of uid u from /proc; a process that ends
// while it is read is left out (the next poll sees the tree without it).
func treeOfUID(t testing.TB, u uint32) []treeProc {
	t.Helper()
	var out []treeProc
	for _, pid := range procsOfUID(t, u) {
		st, err := caps.ReadStatus(fmt.Sprintf("/proc/%d/status", pid))
		pg, perr := unix.Getpgid(pid)
		if err != nil || perr != nil {
			continue
		}
		out = append(out, treeProc{PID: pid, PGID: pg, Name: st.Name, State: st.State})
	}
	return out
}

// killUID is a test's cleanup: it kills c's group (c may be nil), then every process of
// uid u that is left (a test that failed half way may leave sleepers
// outside any group c can still signal), and waits until none is left,
// so that one failure never becomes the next test's "left by earlier
// tests".
func killUID(t testing.TB, c *Child, u uint32) {
	t.Helper()
	if c != nil {
		_ = c.Kill()
	}
	for _, p := range procsOfUID(t, u) {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	waitNoUID(t, u)
}

// TestCancelCycles starts and cancels 1,000 trees; no process of the uid,
// live or zombie, may remain.
func TestCancelCycles(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	t.Cleanup(func() { killUID(t, nil, uid) })
	dir, _ := workDir(t)
	n := 1000
	if testing.Short() {
		n = 100
	}
	for i := range n {
		c, out, err := start(ModeThread, dir, nil, nil, "/bin/sh", "-c", "sleep 100 & (sleep 100 &); exec sleep 100")
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // let some trees grow before the cancel
		}
		c.Kill()
		<-c.Done()
		<-out
	}
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for countUID(t, uid) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := procsOfUID(t, uid); len(left) > 0 {
		t.Fatalf("after %d start/cancel cycles, processes %v remain", n, left)
	}
}

// TestPdeathsigSpawningThread: when the thread that forked a child ends,
// the child dies. launch is run on a thread that then exits at once.
func TestPdeathsigSpawningThread(t *testing.T) {
	testenv.Require(t, "root")
	dir, _ := workDir(t)
	devNull, _ := os.Open(os.DevNull)
	defer devNull.Close()
	_, w, _ := os.Pipe()
	defer w.Close()
	startReaper()
	for name, mode := range modes {
		c := &Child{done: make(chan struct{})}
		errc := make(chan error)
		go func() {
			runtime.LockOSThread() // the thread ends with this goroutine
			errc <- c.launch(&Spec{Mode: mode, Path: "/bin/sleep", Argv: []string{"sleep", "100"}, Env: []string{},
				Dir: dir, Output: w, UID: uid, GID: gid}, devNull)
		}()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
		case <-time.After(30 * time.Second):
			c.Kill()
			t.Fatalf("%s: child survived the end of its spawning thread", name)
		}
		if st := c.Status(); st.Signal != syscall.SIGKILL {
			t.Fatalf("%s: status %+v, want SIGKILL", name, st)
		}
	}
}

// TestPdeathsigUnrelatedThread: other threads ending (a locked goroutine
// exiting, other children's spawning threads) must not kill a child.
func TestPdeathsigUnrelatedThread(t *testing.T) {
	testenv.Require(t, "root")
	dir, _ := workDir(t)
	c, _, err := start(ModeThread, dir, nil, nil, "/bin/sleep", "100")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill()
	before := threadCount(t)
	for range 8 {
		done := make(chan struct{})
		go func() { runtime.LockOSThread(); close(done) }() // destroys its thread
		<-done
		run(t, ModeThread, nil, "/bin/true")
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case <-c.Done():
		t.Fatalf("child died (%+v) when unrelated threads ended", c.Status())
	default:
	}
	if st, err := caps.ReadStatus(fmt.Sprintf("/proc/%d/status", c.PID())); err != nil || st.State == "Z" {
		t.Fatalf("child not alive: %+v %v", st, err)
	}
	t.Logf("threads before %d, after %d", before, threadCount(t))
}

func threadCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestNoLeakIntoReceiver: after 100 spawns in each mode, with and without
// Landlock, every thread of this process has the privileges it started
// with and none has NoNewPrivs.
func TestNoLeakIntoReceiver(t *testing.T) {
	testenv.Require(t, "root")
	want, err := caps.ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	rs, _ := testRuleset(t)
	for i := range 100 {
		var r *Ruleset
		if i%2 == 0 {
			r = rs
		}
		mode := ModeThread
		if i%10 == 9 {
			mode = ModeHelper
		}
		if _, st := run(t, mode, r, "/bin/true"); st.Code != 0 {
			t.Fatalf("spawn %d: %+v", i, st)
		}
	}
	// A spawning thread exits right after its child is reaped, but its
	// exit is asynchronous: wait for the last ones (bounded for a slow guest).
	deadline := time.Now().Add(30 * time.Second)
	for {
		bad := differentThreads(t, want)
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads differ from the process after their children were reaped:\n%s", strings.Join(bad, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func differentThreads(t *testing.T, want caps.Status) []string {
	sts, err := caps.ThreadStatuses(0)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for tid, st := range sts {
		if st.CapBnd != want.CapBnd || st.CapEff != want.CapEff || st.CapPrm != want.CapPrm ||
			st.CapInh != want.CapInh || st.CapAmb != want.CapAmb || st.NoNewPrivs != 0 {
			bad = append(bad, fmt.Sprintf("thread %d: Bnd %x Eff %x Prm %x Inh %x Amb %x NNP %d", tid,
				st.CapBnd, st.CapEff, st.CapPrm, st.CapInh, st.CapAmb, st.NoNewPrivs))
		}
	}
	return bad
}

// assertCmd runs an external command while the reaper is held, so the
// reaper cannot reap it before exec's own Wait does.
func withReaperHeld(f func()) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	f()
}

// TestLeaderExitKillsGroup: a command that exits leaving a background
// process in its group does not leave it running.
func TestLeaderExitKillsGroup(t *testing.T) {
	testenv.Require(t, "root")
	waitNoUID(t, uid)
	t.Cleanup(func() { killUID(t, nil, uid) })
	if _, st := run(t, ModeThread, nil, "/bin/sh", "-c", "sleep 100 & (sleep 100 &); exit 3"); st.Code != 3 {
		t.Fatalf("status %+v", st)
	}
	deadline := time.Now().Add(30 * time.Second) // a bound for a slow guest, not a wait
	for countUID(t, uid) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if left := procsOfUID(t, uid); len(left) > 0 {
		t.Fatalf("background processes %v outlived their group leader", left)
	}
}

// BenchmarkSpawn compares one start-to-reap of /bin/true: a direct
// fork/exec with os/exec (the baseline, as root, no restrictions), the
// per-thread design and the re-exec helper.
func BenchmarkSpawn(b *testing.B) {
	testenv.Require(b, "root")
	b.Run("direct", func(b *testing.B) {
		withReaperHeld(func() {
			for b.Loop() {
				if err := exec.Command("/bin/true").Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	dir, _ := workDir(b)
	for _, name := range []string{"thread", "helper", "clone"} {
		b.Run(name, func(b *testing.B) {
			_, w, _ := os.Pipe()
			defer w.Close()
			spec := Spec{Mode: modes[name], Path: "/bin/true", Argv: []string{"true"}, Env: []string{},
				Dir: dir, Output: w, UID: uid, GID: gid}
			for b.Loop() {
				c, err := Start(spec)
				if err != nil {
					b.Fatal(err)
				}
				<-c.Done()
			}
		})
	}
}

// BenchmarkSpawnRatio interleaves a direct fork/exec of /bin/true and a
// spawn of it in every iteration (load on this shared machine drifts) and
// reports both means and their ratio, per mode.
func BenchmarkSpawnRatio(b *testing.B) {
	testenv.Require(b, "root")
	dir, _ := workDir(b)
	for _, name := range []string{"thread", "helper", "clone"} {
		b.Run(name, func(b *testing.B) {
			_, w, _ := os.Pipe()
			defer w.Close()
			spec := Spec{Mode: modes[name], Path: "/bin/true", Argv: []string{"true"}, Env: []string{},
				Dir: dir, Output: w, UID: uid, GID: gid}
			var direct, spawned time.Duration
			for b.Loop() {
				t0 := time.Now()
				withReaperHeld(func() {
					if err := exec.Command("/bin/true").Run(); err != nil {
						b.Fatal(err)
					}
				})
				t1 := time.Now()
				c, err := Start(spec)
				if err != nil {
					b.Fatal(err)
				}
				<-c.Done()
				direct, spawned = direct+t1.Sub(t0), spawned+time.Since(t1)
			}
			b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/op")
			b.ReportMetric(float64(spawned.Nanoseconds())/float64(b.N), "spawn-ns/op")
			b.ReportMetric(float64(spawned)/float64(direct), "ratio")
		})
	}
}
