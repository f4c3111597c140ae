package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReportFailsOnSkipOnlyWhenStrict(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"T"}
{"Action":"output","Package":"p","Test":"T","Output":"    x_test.go:1: testenv: requirement \"qemu\" is not met\n"}
{"Action":"skip","Package":"p","Test":"T"}
{"Action":"pass","Package":"p"}
`
	t.Setenv("TETHER_TEST_REQUIRE", "")
	var out bytes.Buffer
	if rc := run(strings.NewReader(in), &out, ""); rc != 0 {
		t.Fatalf("lenient run: rc=%d\n%s", rc, out.String())
	}
	if !strings.Contains(out.String(), `requirement "qemu"`) {
		t.Errorf("skip reason not printed:\n%s", out.String())
	}
	t.Setenv("TETHER_TEST_REQUIRE", "root")
	out.Reset()
	if rc := run(strings.NewReader(in), &out, ""); rc != 1 {
		t.Fatalf("strict run with a skip: rc=%d, want 1\n%s", rc, out.String())
	}
}

func TestReportFailsOnFailure(t *testing.T) {
	in := `{"Action":"output","Package":"p","Test":"T","Output":"boom\n"}
{"Action":"fail","Package":"p","Test":"T"}
{"Action":"fail","Package":"p"}
`
	var out bytes.Buffer
	if rc := run(strings.NewReader(in), &out, ""); rc != 1 || !strings.Contains(out.String(), "boom") {
		t.Fatalf("rc=%d out=%s", rc, out.String())
	}
}

// TestReportBenchmarks: a benchmark reports no pass, so it is counted when
// it starts; one that skips is a skip like any test's (fatal when strict),
// one that fails is a failure.
func TestReportBenchmarks(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"BenchmarkOK"}
{"Action":"output","Package":"p","Test":"BenchmarkOK","Output":"BenchmarkOK-2 1 200 ns/op\n"}
{"Action":"run","Package":"p","Test":"BenchmarkS"}
{"Action":"output","Package":"p","Test":"BenchmarkS","Output":"    a_test.go:3: testenv: requirement \"root\" is not met\n"}
{"Action":"skip","Package":"p","Test":"BenchmarkS"}
{"Action":"pass","Package":"p"}
`
	t.Setenv("TETHER_TEST_REQUIRE", "root")
	var out bytes.Buffer
	if rc := run(strings.NewReader(in), &out, ""); rc != 1 || !strings.Contains(out.String(), "2 benchmarks run") ||
		!strings.Contains(out.String(), "--- SKIP p BenchmarkS") {
		t.Fatalf("strict run with a skipped benchmark: rc=%d\n%s", rc, out.String())
	}
	fail := `{"Action":"run","Package":"p","Test":"BenchmarkF"}
{"Action":"output","Package":"p","Test":"BenchmarkF","Output":"boom\n"}
{"Action":"fail","Package":"p","Test":"BenchmarkF"}
{"Action":"fail","Package":"p"}
`
	out.Reset()
	if rc := run(strings.NewReader(fail), &out, ""); rc != 1 || !strings.Contains(out.String(), "=== FAIL p BenchmarkF") {
		t.Fatalf("failed benchmark: rc=%d\n%s", rc, out.String())
	}
}

// TestReportKeepsTheEvidence: a failed test's last 30 lines are printed
// (and no earlier line), the whole output of every failed test and failed
// package goes to the failures file, and a run without failures leaves
// that file empty (no stale evidence).
func TestReportKeepsTheEvidence(t *testing.T) {
	var in strings.Builder
	in.WriteString(`{"Action":"run","Package":"p","Test":"TestLong"}` + "\n")
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&in, `{"Action":"output","Package":"p","Test":"TestLong","Output":"line %02d\n"}`+"\n", i)
	}
	in.WriteString(`{"Action":"fail","Package":"p","Test":"TestLong"}
{"Action":"output","Package":"p","Test":"TestShort","Output":"short boom\n"}
{"Action":"fail","Package":"p","Test":"TestShort"}
{"Action":"output","Package":"p","Output":"panic: test timed out\n"}
{"Action":"fail","Package":"p"}
`)
	file := filepath.Join(t.TempDir(), "test-failures.txt")
	var out bytes.Buffer
	if rc := run(strings.NewReader(in.String()), &out, file); rc != 1 {
		t.Fatalf("rc=%d\n%s", rc, out.String())
	}
	got := out.String()
	if !strings.Contains(got, "=== FAIL p TestLong (last 30 lines; 20 earlier lines") ||
		!strings.Contains(got, "line 21\n") || !strings.Contains(got, "line 50\n") || strings.Contains(got, "line 20\n") {
		t.Errorf("want exactly lines 21..50 of TestLong:\n%s", got)
	}
	if !strings.Contains(got, "=== FAIL p TestShort\nshort boom\n") || !strings.Contains(got, file) {
		t.Errorf("short failure or the file's name missing:\n%s", got)
	}
	kept, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"line 01\n", "line 50\n", "short boom", "=== package p\npanic: test timed out"} {
		if !strings.Contains(string(kept), want) {
			t.Errorf("the failures file lacks %q:\n%s", want, kept)
		}
	}
	pass := `{"Action":"pass","Package":"p","Test":"T"}
{"Action":"pass","Package":"p"}
`
	out.Reset()
	if rc := run(strings.NewReader(pass), &out, file); rc != 0 {
		t.Fatalf("passing run: rc=%d\n%s", rc, out.String())
	}
	if kept, _ := os.ReadFile(file); len(kept) != 0 {
		t.Errorf("a passing run left the old failures in the file:\n%s", kept)
	}
}
