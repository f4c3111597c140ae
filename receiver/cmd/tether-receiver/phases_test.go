package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/internal/cgrouptest"
	"github.com/tetherdev/tether/receiver/wire"
)

// BenchmarkExecPhasesByMode is BenchmarkExecPhases for each way the
// receiver restricts a command: thread mode alone, thread mode with the
// seccomp filter, and the deployed computer's configuration, the filter
// with a cgroup per command (which the config runs through the helper).
// Each sub-benchmark interleaves a direct os/exec start and wait with
// exec_start and exec_wait, so the figures to compare are the ratios
// within one sub-benchmark (docs/performance.md, run G).
func BenchmarkExecPhasesByMode(b *testing.B) {
	testenv.Require(b, "root")
	for _, mode := range []string{"thread", "thread-seccomp", "helper-seccomp-cgroup", "clone-seccomp-cgroup"} {
		b.Run(mode, func(b *testing.B) {
			spawnMode, _, _ := strings.Cut(mode, "-")
			e := newEnv(b, "off", spawnMode)
			if strings.Contains(mode, "seccomp") {
				e.cfg["seccomp"] = map[string]any{"mode": "required"}
			}
			if strings.HasSuffix(mode, "-cgroup") {
				e.cfg["cgroup"] = map[string]any{"mode": "required", "parent": cgrouptest.Parent(b)}
			}
			e.writeConfig()
			e.start()
			benchPhases(b, e.client())
		})
	}
}

// benchPhases runs the interleaved rounds of BenchmarkExecPhasesByMode
// and reports each phase's mean and the exec ratio.
func benchPhases(b *testing.B, c *client) {
	var dStart, dWait, rStart, rWait time.Duration
	for b.Loop() {
		t0 := time.Now()
		cmd := exec.Command("/bin/true")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		var st wire.ExecStartResult
		if err := c.call(wire.OpExecStart, wire.ExecStartArgs{Argv: []string{"/bin/true"}}, &st); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		var w wire.ExecWaitResult
		if err := c.call(wire.OpExecWait, wire.TerminalArgs{TerminalID: st.TerminalID}, &w); err != nil {
			b.Fatal(err)
		}
		if w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 {
			b.Fatalf("exec_wait: /bin/true ended %+v", w.Exit)
		}
		t4 := time.Now()
		dStart, dWait, rStart, rWait = dStart+t1.Sub(t0), dWait+t2.Sub(t1), rStart+t3.Sub(t2), rWait+t4.Sub(t3)
		b.StopTimer()
		if err := c.call(wire.OpExecRelease, wire.TerminalArgs{TerminalID: st.TerminalID}, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(dStart.Nanoseconds())/n, "direct-start-ns/op")
	b.ReportMetric(float64(dWait.Nanoseconds())/n, "direct-wait-ns/op")
	b.ReportMetric(float64(rStart.Nanoseconds())/n, "exec_start-ns/op")
	b.ReportMetric(float64(rWait.Nanoseconds())/n, "exec_wait-ns/op")
	b.ReportMetric(float64(rStart+rWait)/float64(dStart+dWait), "ratio")
}
