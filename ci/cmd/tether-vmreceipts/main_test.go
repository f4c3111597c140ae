package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/ci/vmsuite"
)

func passing(suite string) *receipt.Receipt {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &receipt.Receipt{
		Suite:    suite,
		Tests:    []receipt.Test{{Package: "receiver/caps", Name: "TestCheckPassesAsRoot", Result: receipt.Pass}},
		Declared: []string{"receiver/caps TestCheckPassesAsRoot"},
		Go:       "go1.26.8",
		Kernel:   receipt.Kernel{Release: "6.12", Image: "6.12", VmlinuxSHA256: strings.Repeat("a", 64)},
		QEMU:     receipt.QEMU{Version: "7.2.22", Accelerator: "tcg"},
		Binaries: []receipt.Binary{{Path: "/bin/busybox", SHA256: strings.Repeat("b", 64)}},
		Source:   receipt.Source{GitTree: strings.Repeat("c", 40)},
		Started:  start,
		Ended:    start.Add(time.Minute),
	}
}

func cli(args ...string) (int, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String() + errb.String()
}

func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	if err := receipt.Write(dir, passing(vmsuite.IsolationSuite)); err != nil {
		t.Fatal(err)
	}
	if code, out := cli("check", "--dir", dir, vmsuite.IsolationSuite); code != exitOK || !strings.Contains(out, ": PASS 1 executed / 0 ignored") {
		t.Fatalf("good receipt: %d\n%s", code, out)
	}
	// Every suite is checked by default; one that left no receipt fails.
	all := t.TempDir()
	for _, name := range suiteNames() {
		if err := receipt.Write(all, passing(name)); err != nil {
			t.Fatal(err)
		}
	}
	if code, out := cli("check", "--dir", all); code != exitOK {
		t.Fatalf("every suite passing: %d\n%s", code, out)
	}
	if code, out := cli("check", "--dir", t.TempDir()); code != exitFailed || !strings.Contains(out, "REFUSED") {
		t.Fatalf("no receipts at all: %d\n%s", code, out)
	}
	if code, out := cli("check", "--dir", dir, "native-client"); code != exitFailed || !strings.Contains(out, "missing") {
		t.Fatalf("missing receipt: %d\n%s", code, out)
	}
	short := passing(vmsuite.IsolationSuite)
	short.Declared = append(short.Declared, "receiver/caps TestNeverRan")
	if err := receipt.Write(dir, short); err != nil {
		t.Fatal(err)
	}
	code, out := cli("check", "--dir", dir, vmsuite.IsolationSuite)
	if code != exitFailed || !strings.Contains(out, "1 executed / 0 ignored / 0 failed of 2 declared") ||
		!strings.Contains(out, "declared tests did not run: receiver/caps TestNeverRan") {
		t.Fatalf("short receipt: %d\n%s", code, out)
	}
	failed := passing(vmsuite.IsolationSuite)
	failed.Tests[0].Result, failed.Tests[0].Output = receipt.Fail, "caps_test.go:9: the mask was 0x1\n"
	if err := receipt.Write(dir, failed); err != nil {
		t.Fatal(err)
	}
	code, out = cli("check", "--dir", dir, vmsuite.IsolationSuite)
	if code != exitFailed || !strings.Contains(out, "--- receiver/caps TestCheckPassesAsRoot: the output its receipt kept\n    caps_test.go:9: the mask was 0x1\n") {
		t.Fatalf("a failed test's output is not printed: %d\n%s", code, out)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"check", "--help"}} {
		if code, out := cli(args...); code != exitOK || !strings.Contains(out, "usage") {
			t.Errorf("%v: %d\n%s", args, code, out)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"run", "extra"}, {"run", "--suite", "nope"}} {
		if code, _ := cli(args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// TestRunNeverPassesOnAnOldReceipt: with a passing receipt of an earlier
// run in --out, a mistyped mutation is refused before anything runs (never
// run as the unbroken suite, never answered by the old receipt), and a run
// that cannot boot its guest exits failed with this run's receipt in place
// of the old one. removeStale, which clears a suite's old receipt before
// it runs, tolerates an absent one.
func TestRunNeverPassesOnAnOldReceipt(t *testing.T) {
	out := t.TempDir()
	if err := receipt.Write(out, passing(vmsuite.IsolationSuite)); err != nil {
		t.Fatal(err)
	}
	code, text := cli("run", "--mutate", "no-such-mutation", "--out", out)
	if code != exitUsage || !strings.Contains(text, "no-such-mutation") {
		t.Fatalf("unknown mutation: exit %d, want %d\n%s", code, exitUsage, text)
	}
	if _, err := os.Stat(receipt.Path(out, vmsuite.IsolationSuite)); err != nil {
		t.Fatalf("a refused command line touched the receipts: %v", err)
	}
	// A missing guest kernel: the suite writes a failing receipt, never
	// leaves the old passing one in place.
	noKernel := filepath.Join(t.TempDir(), "no-kernel")
	code, text = cli("run", "--suite", vmsuite.IsolationSuite, "--out", out, "--kernel", noKernel,
		"--work", t.TempDir(), "--accel", "tcg")
	if code != exitFailed || strings.Contains(text, ": PASS") {
		t.Fatalf("run without a kernel over an old passing receipt: exit %d\n%s", code, text)
	}
	// A mutated run's receipt has a name of its own: clearing it never
	// touches the real suite's receipt.
	if err := receipt.Write(out, passing(vmsuite.IsolationSuite)); err != nil {
		t.Fatal(err)
	}
	mutated := vmsuite.IsolationName(vmsuite.Options{Mutation: "keep-cap-kill"})
	if mutated != vmsuite.IsolationSuite+"+keep-cap-kill" {
		t.Fatalf("mutated receipt name %q", mutated)
	}
	if err := removeStale(out, mutated); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(receipt.Path(out, vmsuite.IsolationSuite)); err != nil {
		t.Fatalf("clearing a mutated run's receipt removed the real one: %v", err)
	}
	if err := removeStale(out, vmsuite.IsolationSuite); err != nil {
		t.Fatal(err)
	}
	if err := removeStale(out, vmsuite.IsolationSuite); err != nil {
		t.Fatalf("removing an absent receipt: %v", err)
	}
}
