package flakehunt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/ci/receipt"
)

func events(t *testing.T, ty *Tally, lines ...string) {
	t.Helper()
	if err := ty.Read(strings.NewReader(strings.Join(lines, "\n")+"\n"), nil); err != nil {
		t.Fatal(err)
	}
}

func find(t *testing.T, ty *Tally, pkg, name string) TestTally {
	t.Helper()
	for _, tt := range ty.Tests() {
		if tt.Package == pkg && tt.Name == name {
			return tt
		}
	}
	t.Fatalf("no tally for %s %s in %+v", pkg, name, ty.Tests())
	return TestTally{}
}

// TestTallyCounts: every run's result is counted per test, a failure
// keeps only its last 30 lines (and only 3 failures are kept), a test
// still running when its package's binary ends is a failure, and a
// benchmark still open when its package passed is a pass.
func TestTallyCounts(t *testing.T) {
	ty := NewTally()
	for i := range 4 {
		lines := []string{`{"Action":"run","Package":"p","Test":"TestA"}`}
		for l := range 40 {
			lines = append(lines, fmt.Sprintf(`{"Action":"output","Package":"p","Test":"TestA","Output":"run %d line %d\n"}`, i, l))
		}
		result := "pass"
		if i > 0 {
			result = "fail"
		}
		lines = append(lines, fmt.Sprintf(`{"Action":"%s","Package":"p","Test":"TestA"}`, result))
		events(t, ty, lines...)
	}
	events(t, ty, `{"Action":"run","Package":"p","Test":"TestB"}`, `{"Action":"skip","Package":"p","Test":"TestB"}`,
		`{"Action":"run","Package":"p","Test":"TestHang"}`,
		`{"Action":"output","Package":"p","Test":"TestHang","Output":"waiting\n"}`,
		`{"Action":"output","Package":"p","Output":"panic: test timed out after 1s\n"}`,
		`{"Action":"fail","Package":"p"}`,
		`{"Action":"run","Package":"r","Test":"TestR"}`, `{"Action":"fail","Package":"r","Test":"TestR"}`,
		`{"Action":"fail","Package":"r"}`,
		`{"Action":"run","Package":"b","Test":"BenchmarkQuiet"}`,
		`{"Action":"output","Package":"b","Test":"BenchmarkQuiet","Output":"BenchmarkQuiet-2 \t1\t100 ns/op\n"}`,
		`{"Action":"run","Package":"b","Test":"BenchmarkLogs"}`, `{"Action":"bench","Package":"b","Test":"BenchmarkLogs"}`,
		`{"Action":"pass","Package":"b"}`,
		`{"Action":"build-output","ImportPath":"q","Output":"q/x.go:1: syntax error\n"}`,
		`{"Action":"build-fail","ImportPath":"q"}`,
		`not json at all`)
	a := find(t, ty, "p", "TestA")
	if a.Runs != 4 || a.Passes != 1 || a.Failures != 3 || !a.Flaky() || len(a.Outputs) != 3 {
		t.Fatalf("TestA: %+v", a)
	}
	if o := a.Outputs[0]; !strings.HasPrefix(o, "run 1 line 10\n") || !strings.HasSuffix(o, "run 1 line 39\n") {
		t.Errorf("kept output is not the last 30 lines:\n%s", o)
	}
	if b := find(t, ty, "p", "TestB"); b.Skips != 1 || b.Failures != 0 {
		t.Errorf("TestB: %+v", b)
	}
	if h := find(t, ty, "p", "TestHang"); h.Failures != 1 || !strings.Contains(h.Outputs[0], "waiting") {
		t.Errorf("a test cut off by its package's end: %+v", h)
	}
	// A benchmark that passed quietly has no result event of its own: its
	// package's pass settles it; one that logged ends with "bench".
	for _, n := range []string{"BenchmarkQuiet", "BenchmarkLogs"} {
		if b := find(t, ty, "b", n); b.Runs != 1 || b.Passes != 1 || b.Failures != 0 {
			t.Errorf("%s: %+v", n, b)
		}
	}
	// p timed out (a package failure), q did not build (one too), r
	// failed only because TestR failed (no package failure).
	pk := ty.Packages()
	if len(pk) != 4 || pk[1].Package != "p" || pk[1].Failures != 1 || !strings.Contains(pk[1].Outputs[0], "timed out") ||
		pk[2].Package != "q" || pk[2].Failures != 1 || !strings.Contains(pk[2].Outputs[0], "syntax error") ||
		pk[3].Package != "r" || pk[3].Runs != 1 || pk[3].Failures != 0 || pk[0].Package != "b" || pk[0].Failures != 0 {
		t.Errorf("packages: %+v", pk)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRunFindsTheFlake runs the hunt on testdata/flaky: two fresh rounds
// of -count 4 find TestFlaky failing 4 times in 8 runs, TestSteady never;
// the report on disk says so, and is not clean.
func TestRunFindsTheFlake(t *testing.T) {
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := Run(ctx, Options{Dir: moduleRoot(t), Out: out, Packages: []string{"./ci/flakehunt/testdata/flaky"},
		Count: 4, Rounds: 2, Run: "TestFlaky|TestSteady"})
	if err != nil {
		t.Fatal(err)
	}
	var onDisk Report
	data, err := os.ReadFile(filepath.Join(out, ReportName))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &onDisk); err != nil {
		t.Fatal(err)
	}
	if onDisk.Clean() || r.Clean() || onDisk.Totals.FailedTests != 1 || onDisk.Totals.Failures != 4 || onDisk.Totals.FlakyTests != 1 ||
		onDisk.Totals.PackageFailures != 0 || onDisk.Totals.PackageRuns != 2 {
		t.Fatalf("report totals %+v\n%s", onDisk.Totals, strings.Join(onDisk.Summary, "\n"))
	}
	f := onDisk.Failed[0]
	if f.Name != "TestFlaky" || f.Runs != 8 || f.Passes != 4 || !strings.Contains(f.Outputs[0], "fails on purpose") {
		t.Errorf("TestFlaky: %+v", f)
	}
	if !strings.Contains(onDisk.Summary[0], "FAILURES") || !strings.Contains(strings.Join(onDisk.Summary, "\n"), "FAIL 4/8 ") {
		t.Errorf("summary:\n%s", strings.Join(onDisk.Summary, "\n"))
	}
	for _, n := range []string{"round-1.json", "round-2.json"} {
		if st, err := os.Stat(filepath.Join(out, n)); err != nil || st.Size() == 0 {
			t.Errorf("raw output %s not kept: %v", n, err)
		}
	}
	if onDisk.Config.Count != 4 || onDisk.Config.Rounds != 2 || onDisk.Config.Race {
		t.Errorf("config %+v", onDisk.Config)
	}
	// The raw output of a round, read back alone, counts the same.
	again, err := Run(ctx, Options{Dir: moduleRoot(t), Out: t.TempDir(), Count: 1,
		Inputs: []string{filepath.Join(out, "round-1.json")}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Totals.Failures != 2 || again.Totals.TestRuns != 8 {
		t.Errorf("round-1.json read back: %+v", again.Totals)
	}
}

// TestRunCountsACrash: a test that panics (ending its binary) is a failed
// test in the report, and the report is not clean.
func TestRunCountsACrash(t *testing.T) {
	t.Setenv("FLAKY_CRASH", "1")
	r, err := Run(context.Background(), Options{Dir: moduleRoot(t), Out: t.TempDir(),
		Packages: []string{"./ci/flakehunt/testdata/flaky"}, Count: 1, Rounds: 1, Run: "TestCrash"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Clean() || len(r.Failed) != 1 || r.Failed[0].Name != "TestCrash" || !strings.Contains(r.Failed[0].Outputs[0], "crash on purpose") {
		t.Fatalf("a crash: %+v\n%s", r.Totals, strings.Join(r.Summary, "\n"))
	}
}

// TestVMRunReadsReceipts: the hunt runs ci/vm-receipts with --out and the
// extra arguments, and counts the receipts it leaves; a failed test in a
// receipt fails the run and is tallied under its suite; a run that leaves
// no receipt fails too.
func TestVMRunReadsReceipts(t *testing.T) {
	dir := t.TempDir()
	src := t.TempDir()
	r := &receipt.Receipt{Suite: "native-client", Tests: []receipt.Test{
		{Package: "fixtures/e2e", Name: "TestNativePipeline/reconnect", Result: receipt.Fail, Output: "boom"},
		{Package: "fixtures/e2e", Name: "TestNativePipeline/five_tools", Result: receipt.Pass}}}
	if err := receipt.Write(src, r); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n[ \"$1\" = --out ] && [ \"$3\" = --accel ] && [ \"$4\" = tcg ] || exit 9\n" +
		"[ -z \"$NO_RECEIPT\" ] && cp " + receipt.Path(src, r.Suite) + " \"$2\"/\nexit 1\n"
	if err := os.MkdirAll(filepath.Join(dir, "ci"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ci", "vm-receipts"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Options{Dir: dir, Out: t.TempDir(), Count: 1, VMRuns: 2, VMArgs: []string{"--accel", "tcg"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.VM) != 2 || rep.VM[0].Passed || rep.VM[0].Exit != 1 || rep.Totals.VMFailedRuns != 2 {
		t.Fatalf("VM runs: %+v", rep.VM)
	}
	f := rep.Failed
	if len(f) != 1 || f[0].Package != "vm:native-client/fixtures/e2e" || f[0].Name != "TestNativePipeline/reconnect" ||
		f[0].Failures != 2 || f[0].Runs != 2 || f[0].Outputs[0] != "boom" {
		t.Fatalf("failed tests: %+v", f)
	}
	t.Setenv("NO_RECEIPT", "1")
	rep, err = Run(context.Background(), Options{Dir: dir, Out: t.TempDir(), Count: 1, VMRuns: 1, VMArgs: []string{"--accel", "tcg"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.VM[0].Passed || !strings.Contains(strings.Join(rep.VM[0].Problems, "\n"), "no receipt") {
		t.Fatalf("a run without receipts: %+v", rep.VM[0])
	}
}

func TestOptionsRefused(t *testing.T) {
	for name, o := range map[string]Options{
		"no dir":      {Out: "x", Count: 1, Rounds: 1},
		"count 0":     {Dir: "x", Out: "x", Count: 0, Rounds: 1},
		"nothing":     {Dir: "x", Out: "x", Count: 1},
		"negative vm": {Dir: "x", Out: "x", Count: 1, Rounds: 1, VMRuns: -1},
	} {
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
