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
