package metrics

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/cgroup2"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// envHelper makes the test binary the child the cgroup test measures.
const envHelper = "TETHER_METRICS_TEST_HELPER"

// helperMemory is what the helper allocates and touches.
const helperMemory = 48 << 20

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "spin" {
		spin()
	}
	os.Exit(m.Run())
}

// spin waits for one byte on stdin (its cgroups are set by then), then
// touches helperMemory bytes and spins until killed.
func spin() {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		os.Exit(2)
	}
	mem := make([]byte, helperMemory)
	for i := range mem {
		mem[i] = byte(i)
	}
	for x := 0; ; x++ {
		mem[x%len(mem)]++
	}
}

// TestIntegrationReadUsageRealCgroup: a child that allocates and spins in
// fresh cgroups of this host shows in ReadUsage's readings (v1 cpuacct,
// memory and pids; and the v2 cpu.stat of the cgroup2 mount), and its
// CPU time keeps moving between two readings.
func TestIntegrationReadUsageRealCgroup(t *testing.T) {
	testenv.Require(t, "root", "cgroup-v1")
	paths := CgroupPaths{
		CPUAcct: makeV1(t, "cpuacct"),
		Memory:  makeV1(t, cgroupv1.Memory),
		Pids:    makeV1(t, cgroupv1.Pids),
	}
	v2 := ""
	if mount, err := cgroup2.Mount(); err == nil {
		v2 = makeDir(t, mount)
	} else if testenv.Required("cgroup2") {
		t.Fatalf("cgroup2: %v", err)
	}
	cmd, stdin := startHelper(t)
	for _, d := range []string{paths.CPUAcct, paths.Memory, paths.Pids, v2} {
		if d != "" {
			join(t, d, cmd.Process.Pid)
		}
	}
	if _, err := stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	first := waitUsage(t, paths, func(u api.Usage) bool {
		return u.MemoryBytes >= helperMemory && u.CPUSeconds >= 0.05 && u.Pids >= 1
	})
	t.Logf("v1 reading: %+v", first)
	waitUsage(t, paths, func(u api.Usage) bool { return u.CPUSeconds > first.CPUSeconds+0.05 })
	scrapeUsage(t, paths)
	if v2 == "" {
		t.Log("no cgroup2 mount: the v2 cpu.stat reading is not checked")
		return
	}
	hybrid := CgroupPaths{V2: v2, Memory: paths.Memory, Pids: paths.Pids}
	u := waitUsage(t, hybrid, func(u api.Usage) bool { return u.CPUSeconds >= 0.05 })
	t.Logf("v2 cpu.stat reading: %+v", u)
}

// scrapeUsage: the handler of a registry whose UsageFunc reads the
// cgroups with ReadUsage exports the child's memory and pids.
func scrapeUsage(t *testing.T, paths CgroupPaths) {
	t.Helper()
	m := New(func(context.Context) map[string]api.Usage {
		u, err := ReadUsage(paths)
		if err != nil {
			t.Errorf("ReadUsage at scrape: %v", err)
			return nil
		}
		return map[string]api.Usage{"c-1": u}
	})
	mem, err := testutil.GatherAndCount(m.Registry(), "tether_computer_memory_bytes")
	if err != nil || mem != 1 {
		t.Fatalf("memory series: %d, %v", mem, err)
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == "tether_computer_memory_bytes" {
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v < helperMemory {
				t.Errorf("scraped memory %v, want at least %d", v, helperMemory)
			}
		}
	}
}

// waitUsage polls ReadUsage until ok holds, for at most 30 s.
func waitUsage(t *testing.T, p CgroupPaths, ok func(api.Usage) bool) api.Usage {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	var u api.Usage
	var err error
	for {
		if u, err = ReadUsage(p); err == nil && ok(u) {
			return u
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("usage never reached the condition: last %+v, %v", u, err)
		}
	}
}

// startHelper starts the spinning child, killed and reaped at cleanup.
func startHelper(t *testing.T) (*exec.Cmd, io.Writer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=spin")
	// If the test binary dies, the spinning child must not outlive it.
	// Pdeathsig follows the spawning thread, which the Go runtime keeps
	// for the life of the process here (no locked goroutine exits).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, stdin
}

// makeV1 makes a fresh child of this process's cgroup in the v1
// hierarchy of controller.
func makeV1(t *testing.T, controller string) string {
	t.Helper()
	dir, err := cgroupv1.Dir(controller)
	if err != nil {
		t.Fatalf("cgroup v1 %s: %v", controller, err)
	}
	return makeDir(t, dir)
}

// makeDir makes a fresh cgroup under parent, removed at cleanup (after
// the helper is reaped: cleanups run last-registered first, and the
// cgroups are made before the helper starts).
func makeDir(t *testing.T, parent string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	dir := filepath.Join(parent, "tether-metrics-test-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rmdirCgroup(t, dir) })
	return dir
}

// rmdirCgroup removes an empty cgroup; a reaped process may leave it busy
// for a moment, so EBUSY is retried for a bounded time.
func rmdirCgroup(t *testing.T, dir string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			t.Errorf("remove cgroup %s: %v", dir, err)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func join(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move %d into %s: %v", pid, dir, err)
	}
}
