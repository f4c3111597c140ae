package main

import (
	"bytes"
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
	if rc := run(strings.NewReader(in), &out); rc != 0 {
		t.Fatalf("lenient run: rc=%d\n%s", rc, out.String())
	}
	if !strings.Contains(out.String(), `requirement "qemu"`) {
		t.Errorf("skip reason not printed:\n%s", out.String())
	}
	t.Setenv("TETHER_TEST_REQUIRE", "root")
	out.Reset()
	if rc := run(strings.NewReader(in), &out); rc != 1 {
		t.Fatalf("strict run with a skip: rc=%d, want 1\n%s", rc, out.String())
	}
}

func TestReportFailsOnFailure(t *testing.T) {
	in := `{"Action":"output","Package":"p","Test":"T","Output":"boom\n"}
{"Action":"fail","Package":"p","Test":"T"}
{"Action":"fail","Package":"p"}
`
	var out bytes.Buffer
	if rc := run(strings.NewReader(in), &out); rc != 1 || !strings.Contains(out.String(), "boom") {
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
	if rc := run(strings.NewReader(in), &out); rc != 1 || !strings.Contains(out.String(), "2 benchmarks run") ||
		!strings.Contains(out.String(), "--- SKIP p BenchmarkS") {
		t.Fatalf("strict run with a skipped benchmark: rc=%d\n%s", rc, out.String())
	}
	fail := `{"Action":"run","Package":"p","Test":"BenchmarkF"}
{"Action":"output","Package":"p","Test":"BenchmarkF","Output":"boom\n"}
{"Action":"fail","Package":"p","Test":"BenchmarkF"}
{"Action":"fail","Package":"p"}
`
	out.Reset()
	if rc := run(strings.NewReader(fail), &out); rc != 1 || !strings.Contains(out.String(), "=== FAIL p BenchmarkF") {
		t.Fatalf("failed benchmark: rc=%d\n%s", rc, out.String())
	}
}
