package vmsuite

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/fixtures/guest"
	"github.com/tetherdev/tether/fixtures/testenv"
)

// subset is the package the runner's own tests boot: small, and it holds
// the exact-mask tests (TestChildMasks) the mutations must trip.
const subset = "./receiver/spawn"

// runSubset runs suite (a) on subset with opts' mutation and kernel
// arguments, under TCG, and returns the receipt read back from disk with
// the checker's verdict.
func runSubset(t *testing.T, mutation string, appendArgs ...string) (*receipt.Receipt, error) {
	t.Helper()
	testenv.Require(t, "root", "qemu")
	if _, err := guest.KernelAt(DefaultKernelDir()); err != nil {
		t.Fatalf("%v (run ci/vmkernel as root)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	opts := Options{Dir: moduleRoot(t), Work: t.TempDir(), Out: t.TempDir(), Accel: AccelTCG,
		Packages: subset, Mutation: mutation, Append: appendArgs, Log: logWriter{t}}
	h := NewHost(ctx, opts)
	r, err := RunIsolation(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, checkErr := receipt.CheckFile(opts.Out, r.Suite)
	if onDisk == nil {
		t.Fatalf("no receipt on disk: %v", checkErr)
	}
	for _, p := range onDisk.Problems {
		t.Logf("receipt problem: %s", p)
	}
	return onDisk, checkErr
}

// The runner itself works: the unbroken subset passes, with provenance.
// Without this, the failures below could be the runner's, not the
// mutations'.
func TestIntegrationSubsetPasses(t *testing.T) {
	r, err := runSubset(t, "")
	if err != nil {
		t.Fatalf("unbroken receiver refused: %v", err)
	}
	if r.Suite != IsolationSuite+"-subset" || r.Counts.Executed < r.Counts.Declared || r.Counts.Declared < 10 {
		t.Fatalf("receipt %s", r.Summary)
	}
	if !strings.HasPrefix(r.Kernel.Release, "6.") || r.Kernel.Release != r.Kernel.Image {
		t.Errorf("guest kernel %+v: the release must come from the running guest and match the image", r.Kernel)
	}
	have := map[string]bool{}
	for _, b := range r.Binaries {
		have[b.Path] = true
	}
	for _, p := range []string{BinDir + "/receiver_spawn.test", InitPath, "/bin/busybox", "/bin/sh", "/usr/sbin/capsh"} {
		if !have[p] {
			t.Errorf("binary %s missing from the receipt", p)
		}
	}
}

// Each deliberate breakage of the receiver makes the suite fail through
// the tests that attack it (not only through the mutation's own notice).
func TestIntegrationMutationsFailTheSuite(t *testing.T) {
	for _, c := range []struct{ mutation, field string }{
		{"keep-cap-kill", "CapBnd"},
		{"skip-no-new-privs", "NoNewPrivs"},
	} {
		t.Run(c.mutation, func(t *testing.T) {
			r, err := runSubset(t, c.mutation)
			if !errors.Is(err, receipt.ErrRejected) {
				t.Fatalf("a receiver with %s passed: %s", c.mutation, r.Summary)
			}
			if !strings.HasSuffix(r.Suite, "+"+c.mutation) {
				t.Errorf("suite %q does not name the mutation", r.Suite)
			}
			var failed []string
			var output strings.Builder
			for _, tt := range r.Tests {
				if tt.Result == receipt.Fail {
					failed = append(failed, tt.Name)
				}
				if tt.Name == "TestChildMasks" || strings.HasPrefix(tt.Name, "TestChildMasks/") {
					output.WriteString(tt.Output)
				}
			}
			for _, want := range []string{"TestChildMasks", "TestChildMasks/thread", "TestChildMasks/helper"} {
				if !slices.Contains(failed, want) {
					t.Errorf("%s did not fail (failed: %v)", want, failed)
				}
			}
			if !strings.Contains(output.String(), c.field) {
				t.Errorf("TestChildMasks failed, but not on %s:\n%s", c.field, output.String())
			}
		})
	}
}

// A guest that never boots (here: the kernel finds no init and panics)
// leaves a failing receipt, not a missing one.
func TestIntegrationNeverBootsLeavesFailingReceipt(t *testing.T) {
	r, err := runSubset(t, "", "rdinit=/no-such-init")
	var re *receipt.RejectError
	if !errors.As(err, &re) {
		t.Fatalf("CheckFile = %v, want a rejection", err)
	}
	joined := strings.Join(re.Reasons, "\n")
	for _, want := range []string{"guest did not boot", "fewer than the", "guest_kernel.release"} {
		if !strings.Contains(joined, want) {
			t.Errorf("reasons do not say %q:\n%s", want, joined)
		}
	}
	if !strings.Contains(strings.Join(r.Problems, "\n"), "Kernel panic") {
		t.Errorf("the problem does not quote the kernel's panic:\n%s", r.Problems)
	}
}

// The accelerator is chosen by booting, never by opening /dev/kvm: on the
// CI machine KVM opens but cannot run a guest.
func TestIntegrationAccelProbeBoots(t *testing.T) {
	testenv.Require(t, "root", "qemu")
	k, err := guest.KernelAt(DefaultKernelDir())
	if err != nil {
		t.Fatalf("%v (run ci/vmkernel as root)", err)
	}
	ctx := context.Background()
	a, err := guest.ChooseAccel(ctx, AccelAuto, k, "qemu-system-x86_64", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, kvmErr := guest.ChooseAccel(ctx, AccelKVM, k, "qemu-system-x86_64", t.TempDir())
	switch a.Name {
	case AccelKVM:
		if !strings.Contains(a.Reason, "booted") || kvmErr != nil {
			t.Fatalf("kvm chosen (%s) but --accel kvm: %v", a.Reason, kvmErr)
		}
	case AccelTCG:
		if !strings.HasPrefix(a.Reason, "KVM unusable: ") || !errors.Is(kvmErr, guest.ErrAccel) {
			t.Fatalf("tcg chosen (%s) but --accel kvm: %v", a.Reason, kvmErr)
		}
		if _, err := os.Stat("/dev/kvm"); err == nil && !strings.Contains(a.Reason, "probe guest") {
			t.Errorf("/dev/kvm exists, so the verdict must come from the probe guest: %s", a.Reason)
		}
	default:
		t.Fatalf("accelerator %+v", a)
	}
	if a, _ := guest.ChooseAccel(ctx, AccelTCG, k, "", ""); a.Name != AccelTCG {
		t.Fatalf("--accel tcg gave %+v", a)
	}
	if _, err := guest.ChooseAccel(ctx, "hvf", k, "", ""); !errors.Is(err, guest.ErrAccel) {
		t.Fatalf("unknown mode: %v", err)
	}
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
