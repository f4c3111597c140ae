package spawn

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// v1Pair makes a fresh cgroup in this process's pids hierarchy with
// pids.max limit and returns it with the open tasks files spawn needs:
// the new cgroup's and this process's own.
func v1Pair(t testing.TB, limit int) (string, CgroupV1) {
	return v1PairOf(t, cgroupv1.Pids, strconv.Itoa(limit))
}

// v1PairOf is v1Pair in the hierarchy of controller, with its limit file
// set to limit.
func v1PairOf(t testing.TB, controller, limit string) (string, CgroupV1) {
	t.Helper()
	own, err := cgroupv1.Dir(controller)
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	rand.Read(b[:])
	dir := filepath.Join(own, "tether-spawntest-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for os.Remove(dir) != nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // killed children still exiting
		}
	})
	if err := os.WriteFile(filepath.Join(dir, cgroupv1.LimitFile[controller]), []byte(limit), 0); err != nil {
		t.Fatal(err)
	}
	open := func(p string) *os.File {
		f, err := os.OpenFile(filepath.Join(p, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	return dir, CgroupV1{Join: open(dir), Back: open(own)}
}

// TestCgroupV1Join: a child started with CgroupsV1 is in the v1 cgroup
// from its first instruction, its descendants are bounded by that
// cgroup's pids.max, and the spawning thread went back: no thread of
// this process is left in it.
//
// The spawning thread is in the cgroup (one of its pids) until the
// child has exec'd and the thread has moved back; a command that forks
// at once may meet that moment. The command therefore forks only once
// the test has seen the thread leave (a FIFO it waits on), so the six
// tasks counted are the command's own.
func TestCgroupV1Join(t *testing.T) {
	testenv.Require(t, "root", "cgroup-v1")
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			dir, cg := v1Pair(t, 6)
			r, w, _ := os.Pipe()
			wd, path := workDir(t)
			gate := filepath.Join(path, "gate")
			if err := unix.Mkfifo(gate, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(gate, int(uid), int(gid)); err != nil {
				t.Fatal(err)
			}
			script := `grep :pids: /proc/self/cgroup; read x < gate; exec perl -e '$| = 1; for (1..20) { my $p = fork; if (defined $p && $p == 0) { sleep 30; exit } } print "forked\n"; sleep 30'`
			c, err := Start(Spec{Mode: mode, Path: "/bin/sh", Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
				Dir: wd, UID: uid, GID: gid, Groups: groups, Output: w, CgroupsV1: []CgroupV1{cg}})
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { c.Kill(); <-c.Done() }()
			br := bufio.NewReader(r)
			line, _ := br.ReadString('\n')
			if !strings.Contains(line, ":pids:"+strings.TrimPrefix(dir, mustOwnMount(t))) {
				t.Fatalf("child's first pids cgroup line %q, want %s", line, dir)
			}
			waitFor(t, func() bool { return len(ownThreadsIn(t, dir)) == 0 }) // the spawning thread went back
			g, err := os.OpenFile(gate, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			g.WriteString("go\n")
			g.Close()
			if line, _ := br.ReadString('\n'); line != "forked\n" { // every fork was tried
				t.Fatalf("perl said %q", line)
			}
			if got := count(t, dir); got != 6 {
				t.Fatalf("%d tasks in the cgroup, pids.max is 6", got)
			}
			if own := ownThreadsIn(t, dir); len(own) > 0 {
				t.Fatalf("threads %v of this process are still in %s", own, dir)
			}
		})
	}
}

// ownThreadsIn lists the threads of this process in the v1 cgroup dir.
func ownThreadsIn(t *testing.T, dir string) []int {
	t.Helper()
	var own []int
	for _, task := range tasks(t, dir) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", os.Getpid(), task)); err == nil {
			own = append(own, task)
		}
	}
	return own
}

func mustOwnMount(t *testing.T) string {
	t.Helper()
	own, err := cgroupv1.Dir(cgroupv1.Pids)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(own, "/")
}

func tasks(t *testing.T, dir string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

func count(t *testing.T, dir string) int { return len(tasks(t, dir)) }

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkCgroupV1Join interleaves a plain start of /bin/true (to its
// reaping) with one that joins a pids and a memory cgroup v1 (four
// writes to the spawning thread's tasks files), alternating which goes
// first, and reports each one's median and the difference of the
// medians: what the limits of a hybrid host cost an exec. Medians,
// because a shared machine's stalls swamp means.
func BenchmarkCgroupV1Join(b *testing.B) {
	testenv.Require(b, "root", "cgroup-v1")
	dir, _ := workDir(b)
	_, pids := v1PairOf(b, cgroupv1.Pids, "1000")
	_, mem := v1PairOf(b, cgroupv1.Memory, strconv.Itoa(1<<30))
	_, w, _ := os.Pipe()
	defer w.Close()
	spec := Spec{Mode: ModeThread, Path: "/bin/true", Argv: []string{"true"}, Env: []string{}, Dir: dir, Output: w, UID: uid, GID: gid}
	joined := spec
	joined.CgroupsV1 = []CgroupV1{pids, mem}
	specs := []Spec{spec, joined}
	lat := [2][]time.Duration{}
	for i := 0; b.Loop(); i++ {
		for j := range specs {
			k := (i + j) % 2
			t0 := time.Now()
			c, err := Start(specs[k])
			if err != nil {
				b.Fatal(err)
			}
			<-c.Done()
			lat[k] = append(lat[k], time.Since(t0))
		}
	}
	plain, join := median(lat[0]), median(lat[1])
	b.ReportMetric(float64(plain.Nanoseconds()), "plain-p50-ns")
	b.ReportMetric(float64(join.Nanoseconds()), "v1-join-p50-ns")
	b.ReportMetric(float64((join - plain).Nanoseconds()), "v1-cost-p50-ns")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
