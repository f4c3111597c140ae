package receipt

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrRejected is wrapped by every receipt the checker refuses.
var ErrRejected = errors.New("receipt rejected")

// RejectError lists every reason a suite's receipt was refused.
type RejectError struct {
	Suite   string
	Reasons []string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrRejected, e.Suite, strings.Join(e.Reasons, "; "))
}

// Is makes errors.Is(err, ErrRejected) hold.
func (e *RejectError) Is(target error) bool { return target == ErrRejected }

// maxNamed bounds how many test names one reason lists.
const maxNamed = 8

// Check reports why r does not prove a complete, clean run of suite, as a
// *RejectError, or nil. It refuses: another suite's receipt; any problem;
// counts that do not match the tests listed; any failed or skipped test;
// a suite that declares nothing or executed fewer tests than it declares;
// an unknown result or a test listed twice; and missing provenance (Go,
// kernel, QEMU, binaries, source, times).
func (r *Receipt) Check(suite string) error {
	var why []string
	add := func(format string, args ...any) { why = append(why, fmt.Sprintf(format, args...)) }
	if r.Suite != suite {
		add("the receipt names suite %q", r.Suite)
	}
	for _, p := range r.Problems {
		add("problem: %s", firstLine(p))
	}
	why = append(why, checkTests(r)...)
	why = append(why, checkProvenance(r)...)
	if len(why) == 0 {
		return nil
	}
	return &RejectError{Suite: suite, Reasons: why}
}

func checkTests(r *Receipt) []string {
	var why []string
	var failed, skipped []string
	seen := map[string]bool{}
	for _, t := range r.Tests {
		key := t.Key()
		if seen[key] {
			why = append(why, fmt.Sprintf("test %s is listed twice", key))
		}
		seen[key] = true
		switch t.Result {
		case Pass:
		case Fail:
			failed = append(failed, key)
		case Skip:
			skipped = append(skipped, key)
		default:
			why = append(why, fmt.Sprintf("test %s has unknown result %q", key, t.Result))
		}
	}
	c := r.Counts
	if got := Tally(r.Tests, r.Declared); got != c {
		why = append(why, fmt.Sprintf("counts %+v do not match the tests listed (%+v)", c, got))
	}
	var unrun []string
	for _, d := range r.Declared {
		if !seen[d] {
			unrun = append(unrun, d)
		}
	}
	if len(unrun) > 0 {
		why = append(why, fmt.Sprintf("%d declared tests did not run: %s", len(unrun), names(unrun)))
	}
	if len(failed) > 0 {
		why = append(why, fmt.Sprintf("%d failed: %s", len(failed), names(failed)))
	}
	if len(skipped) > 0 {
		why = append(why, fmt.Sprintf("%d ignored (skipped): %s", len(skipped), names(skipped)))
	}
	got := Tally(r.Tests, r.Declared)
	switch {
	case got.Declared <= 0:
		why = append(why, "the suite declares no tests")
	case got.Executed < got.Declared:
		why = append(why, fmt.Sprintf("%d executed, fewer than the %d declared", got.Executed, got.Declared))
	}
	return why
}

func names(list []string) string {
	if len(list) > maxNamed {
		return strings.Join(list[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(list)-maxNamed)
	}
	return strings.Join(list, ", ")
}

func checkProvenance(r *Receipt) []string {
	var why []string
	need := func(ok bool, what string) {
		if !ok {
			why = append(why, "missing "+what)
		}
	}
	need(strings.HasPrefix(r.Go, "go"), "go_version")
	need(r.Kernel.Release != "", "guest_kernel.release (the guest never reported one)")
	need(r.Kernel.Image != "", "guest_kernel.image")
	need(isHex(r.Kernel.VmlinuxSHA256, 64), "guest_kernel.vmlinux_sha256")
	need(r.QEMU.Version != "", "qemu.version")
	need(r.QEMU.Accelerator == "tcg" || r.QEMU.Accelerator == "kvm", "qemu.accelerator (tcg or kvm)")
	need(len(r.Binaries) > 0, "binaries")
	for _, b := range r.Binaries {
		need(b.Path != "" && isHex(b.SHA256, 64), fmt.Sprintf("sha256 of binary %q", b.Path))
	}
	need(isHex(r.Source.GitTree, 40) || isHex(r.Source.GitTree, 64), "source.git_tree")
	need(!r.Started.IsZero() && !r.Ended.Before(r.Started), "started/ended (ended must not precede started)")
	return why
}

func isHex(s string, n int) bool {
	if len(s) != n || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// CheckFile reads suite's receipt from dir and checks it. A missing or
// unreadable receipt is refused like a failing one.
func CheckFile(dir, suite string) (*Receipt, error) {
	r, err := Read(dir, suite)
	if err != nil {
		return nil, &RejectError{Suite: suite, Reasons: []string{"unreadable or missing: " + err.Error()}}
	}
	return r, r.Check(suite)
}
