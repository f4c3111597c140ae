// Package flaky is the flake hunt's own test subject (never part of
// ./..., being under testdata): TestFlaky fails on every second run in a
// process, TestSteady always passes, TestCgo checks how it was built.
// (Skips are counted by the tally's own test, from recorded events: a
// fixture that skips would be a skip outside the test gate.)
package flaky

import (
	"os"
	"testing"
)

var runs int

func TestFlaky(t *testing.T) {
	runs++
	if runs%2 == 0 {
		t.Fatalf("run %d fails on purpose", runs)
	}
}

func TestSteady(t *testing.T) {}

// TestCrash panics when FLAKY_CRASH is set: the binary ends mid-test.
func TestCrash(t *testing.T) {
	if os.Getenv("FLAKY_CRASH") != "" {
		panic("crash on purpose")
	}
}

// TestCgo fails when FLAKY_WANT_CGO is set and the binary was built
// otherwise (CGO_ENABLED, seen through the cgo build constraint).
func TestCgo(t *testing.T) {
	if want := os.Getenv("FLAKY_WANT_CGO"); want != "" && want != builtWithCgo {
		t.Fatalf("built with CGO_ENABLED=%s, want %s", builtWithCgo, want)
	}
}
