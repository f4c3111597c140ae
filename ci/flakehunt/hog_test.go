package flakehunt

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the user and system CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHogBurnsCPU: two busy loops use CPU time while this goroutine only
// waits (the wait ends as soon as they have used 300 ms, bounded by
// 30 s), and stop ends them and restores GOMAXPROCS.
func TestHogBurnsCPU(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	before := cpuTime(t)
	stop := startHog(2)
	if got := runtime.GOMAXPROCS(0); got != procs+2 {
		stop()
		t.Fatalf("GOMAXPROCS %d while the hog runs, want %d", got, procs+2)
	}
	deadline := time.Now().Add(30 * time.Second)
	for cpuTime(t)-before < 300*time.Millisecond {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the hog used %s of CPU in 30 s", cpuTime(t)-before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Fatalf("GOMAXPROCS %d after stop, want %d", got, procs)
	}
}

// TestRunWithHogAndCgo: -cgo=0 reaches go test (the subject's TestCgo
// sees a build without cgo, and fails with -cgo=1: the positive control),
// and the report records and prints the busy loops and CGO_ENABLED.
func TestRunWithHogAndCgo(t *testing.T) {
	t.Setenv("FLAKY_WANT_CGO", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o := Options{Dir: moduleRoot(t), Packages: []string{"./ci/flakehunt/testdata/flaky"}, Count: 2, Rounds: 1, Run: "TestCgo", Hog: 1}
	for _, c := range []struct {
		cgo   string
		clean bool
	}{{"0", true}, {"1", false}} {
		o.Out, o.Cgo = t.TempDir(), c.cgo
		r, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.Clean() != c.clean || r.Totals.TestRuns != 2 || r.Config.Hog != 1 || r.Config.CgoEnabled != c.cgo {
			t.Fatalf("-cgo=%s: clean %t, %+v, config %+v\n%s", c.cgo, r.Clean(), r.Totals, r.Config, strings.Join(r.Summary, "\n"))
		}
		if !strings.Contains(r.Summary[0], "1 busy loops beside") || strings.Contains(r.Summary[0], "CGO_ENABLED=0") != (c.cgo == "0") {
			t.Errorf("-cgo=%s summary: %s", c.cgo, r.Summary[0])
		}
	}
}

func TestHogAndCgoOptionsRefused(t *testing.T) {
	for name, o := range map[string]Options{
		"negative hog":       {Dir: "x", Out: "x", Count: 1, Rounds: 1, Hog: -1},
		"hog beside nothing": {Dir: "x", Out: "x", Count: 1, Inputs: []string{"x"}, Hog: 2},
		"cgo 2":              {Dir: "x", Out: "x", Count: 1, Rounds: 1, Cgo: "2"},
		"cgo without rounds": {Dir: "x", Out: "x", Count: 1, VMRuns: 1, Cgo: "0"},
		"cgo 0 with -race":   {Dir: "x", Out: "x", Count: 1, Rounds: 1, Cgo: "0", Race: true},
	} {
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
