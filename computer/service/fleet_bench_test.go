//go:build fleetbench

package service

// BenchmarkFleet is long (minutes at N = 1000), so it is built only with
// the fleetbench tag: `make bench-fleet`, never `make bench` or `make
// test` (docs/performance.md "Computer service").

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
)

// envInt is the integer in the environment variable name, or def.
func envInt(b *testing.B, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// BenchmarkFleet makes TETHER_FLEET_N idle computers (default 1000) on
// one service, TETHER_FLEET_WORKERS creates at a time (default 8), each
// with a disk of TETHER_FLEET_DISK bytes (default 16 MiB: below the
// provisioner's tinyDisk, a tmpfs; 32 MiB or more is an ext4 image on a
// loop device). With all of them up at once it reads the host's
// MemAvailable against its reading before the first create, and the
// receivers' Rss and Pss (/proc/PID/smaps_rollup), and again after
// the deletes (what they gave back: a second reading of the same cost,
// as noisy, since other jobs move MemAvailable too); it times one pass of
// the idle check over the fleet, then deletes them all as many at a
// time, and checks that nothing of any is left (provision.NothingLeft
// of each computer's state, no machine directory, MemAvailable back).
// The service's own idle check is set to an hour so that it does not
// run during the measurement; the pass is timed by hand instead.
func BenchmarkFleet(b *testing.B) {
	n := int(envInt(b, "TETHER_FLEET_N", 1000))
	workers := int(envInt(b, "TETHER_FLEET_WORKERS", 8))
	disk := envInt(b, "TETHER_FLEET_DISK", 16<<20)
	set := benchBins(b)
	s := openBench(b, benchDir(b), "fleet", set, Config{IdleCheck: time.Hour, MaxLeaseTTL: 24 * time.Hour})
	limits := api.Limits{DiskBytes: disk}
	for b.Loop() {
		before := memAvailable(b)
		procsBefore := countProcs(b)
		start := time.Now()
		cs, errs := parallel(n, workers, func(i int) (api.Computer, error) {
			return s.Create(context.Background(), alice, api.CreateRequest{Limits: limits})
		})
		makeAll := time.Since(start)
		var up []api.Computer
		var states []provision.State
		failed := 0
		for i, c := range cs {
			if errs[i] != nil {
				if failed++; failed == 1 {
					b.Logf("create %d of %d: %v", i+1, n, errs[i])
				}
				continue
			}
			st, err := provision.ReadState(filepath.Dir(c.CustodianConfig))
			if err != nil {
				b.Fatalf("state of %s: %v", c.ID, err)
			}
			up = append(up, c)
			states = append(states, st)
		}
		alive := 0
		var rss, pss, anon, file int64
		for _, st := range states {
			if provision.Alive(st.ReceiverPID, st.ReceiverStart) {
				alive++
			}
			r := smapsRollup(b, st.ReceiverPID)
			rss, pss, anon, file = rss+r["Rss"], pss+r["Pss"], anon+r["Pss_Anon"], file+r["Pss_File"]
		}
		allUp := alive == n && s.Stats().ByState[api.StateRunning] == n
		during := memAvailable(b)
		procsDuring := countProcs(b)
		idlePass := timeIdlePass(s)

		start = time.Now()
		_, delErrs := parallel(len(up), workers, func(i int) (struct{}, error) {
			return struct{}{}, s.Delete(context.Background(), alice, up[i].ID)
		})
		endAll := time.Since(start)
		for i, err := range delErrs {
			if err != nil {
				b.Errorf("delete %s: %v", up[i].ID, err)
			}
		}
		left := 0
		for _, st := range states {
			if err := provision.NothingLeft(st); err != nil {
				left++
				if left == 1 {
					b.Errorf("%s: %v", st.Dir, err)
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(s.cfg.Dir, "computers")); err != nil || len(ents) != 0 {
			b.Errorf("computers/ after all were deleted: %d entries, %v", len(ents), err)
			left++
		}
		after := memAvailable(b)

		mib := func(kib int64) float64 { return float64(kib) / 1024 }
		perUp := func(kib int64) float64 { return mib(kib) / float64(max(len(up), 1)) }
		b.ReportMetric(float64(n), "N")
		b.ReportMetric(boolMetric(allUp), "all-up")
		b.ReportMetric(float64(len(up)), "made")
		b.ReportMetric(perUp(before-during), "host-MiB/computer")
		b.ReportMetric(perUp(after-during), "host-MiB/computer-freed")
		b.ReportMetric(perUp(pss), "receiver-Pss-MiB")
		b.ReportMetric(perUp(rss), "receiver-Rss-MiB")
		b.ReportMetric(perUp(anon), "receiver-Pss_Anon-MiB")
		b.ReportMetric(perUp(file), "receiver-Pss_File-MiB")
		b.ReportMetric(float64(procsDuring-procsBefore)/float64(max(len(up), 1)), "procs/computer")
		b.ReportMetric(makeAll.Seconds(), "make-all-s")
		b.ReportMetric(endAll.Seconds(), "end-all-s")
		b.ReportMetric(float64(idlePass.Milliseconds()), "idle-pass-ms")
		b.ReportMetric(mib(before-after), "host-MiB-not-back")
		b.ReportMetric(float64(left), "left")
		b.Logf("N %d: %d made, %d receivers alive; MemAvailable %d → %d → %d MiB; receivers Rss %.0f, Pss %.0f MiB in all",
			n, len(up), alive, before>>10, during>>10, after>>10, mib(rss), mib(pss))
	}
}

func boolMetric(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// parallel calls f(0..n-1) from workers goroutines and returns the
// results and errors by index.
func parallel[T any](n, workers int, f func(i int) (T, error)) ([]T, []error) {
	out, errs := make([]T, n), make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, errs
}

// timeIdlePass times one pass of the idle check (as idleLoop makes each
// IdleCheck) over every made computer.
func timeIdlePass(s *Service) time.Duration {
	start := time.Now()
	for _, c := range s.made() {
		s.checkIdle(c)
	}
	return time.Since(start)
}

// memAvailable is /proc/meminfo's MemAvailable in KiB.
func memAvailable(b *testing.B) int64 {
	b.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m := kibFields(b, f)
	v, ok := m["MemAvailable"]
	if !ok {
		b.Fatal("/proc/meminfo has no MemAvailable")
	}
	return v
}

// smapsRollup reads pid's /proc/PID/smaps_rollup (KiB by field).
func smapsRollup(b *testing.B, pid int) map[string]int64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	return kibFields(b, f)
}

// kibFields parses "Name:   123 kB" lines; other lines are skipped.
func kibFields(b *testing.B, f *os.File) map[string]int64 {
	b.Helper()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		fs := strings.Fields(rest)
		if !ok || len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		v, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			b.Fatalf("%s: %q", f.Name(), sc.Text())
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return out
}

// countProcs is the number of processes on the host.
func countProcs(b *testing.B) int {
	b.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}
