// Package receipt is the record a CI VM suite leaves behind
// (ci/receipts/<suite>.json) and the checker that decides whether it
// proves the suite ran: present, no failure, no skip, and at least as many
// tests executed as the suite declares. docs/ci.md explains how to read one.
package receipt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/strictjson"
)

// Result is one test's outcome.
type Result string

// The closed set of results.
const (
	Pass Result = "pass"
	Fail Result = "fail"
	Skip Result = "skip"
)

// Receipt is one suite run. Every field is filled by the runner; the
// checker recomputes Counts from Tests and never trusts Summary.
type Receipt struct {
	Suite    string     `json:"suite"`
	Summary  string     `json:"summary"`  // the one line printed for a person
	Problems []string   `json:"problems"` // suite-level failures no single test carries (no boot, a crashed binary)
	Counts   Counts     `json:"counts"`
	Go       string     `json:"go_version"`
	Kernel   Kernel     `json:"guest_kernel"`
	QEMU     QEMU       `json:"qemu"`
	Source   Source     `json:"source"`
	Started  time.Time  `json:"started"`
	Ended    time.Time  `json:"ended"`
	Excluded []Excluded `json:"excluded"`       // tests of the suite's packages it does not run, and why
	Declared []string   `json:"declared_tests"` // "package name" of every test the suite must execute
	Tests    []Test     `json:"tests"`          // every test and subtest that reported, in run order
	Binaries []Binary   `json:"binaries"`       // every binary placed in the guest image (and run on the host)
}

// Counts summarises Tests. Declared is the number of tests the suite
// names as ones it must execute (declared_tests: every top-level test its
// binaries list, plus any subtest the suite names); Executed, Ignored and
// Failed count the tests at any level (subtests included) that ran to a
// pass or a fail, were skipped, or failed.
type Counts struct {
	Declared int `json:"declared"`
	Executed int `json:"executed"`
	Ignored  int `json:"ignored"`
	Failed   int `json:"failed"`
}

// Test is one test or subtest. Name is "Test" or "Test/sub"; Package is
// the import path relative to the module. Output keeps the tail of what a
// failed or skipped test printed.
type Test struct {
	Package  string  `json:"package"`
	Name     string  `json:"name"`
	Result   Result  `json:"result"`
	ElapsedS float64 `json:"elapsed_s"`
	Output   string  `json:"output,omitempty"`
}

// Excluded is a test the suite deliberately does not run, with the reason
// (e.g. it boots its own VM, which the suite's guest cannot).
type Excluded struct {
	Package string `json:"package"`
	Name    string `json:"name"`
	Reason  string `json:"reason"`
}

// Key is how declared_tests names t: "package name".
func (t Test) Key() string { return t.Package + " " + t.Name }

// Kernel is the guest kernel: Release as the running guest reported it
// (empty if it never booted), Image as the unpacked package names it.
type Kernel struct {
	Release       string `json:"release"`
	Image         string `json:"image"`
	VmlinuxSHA256 string `json:"vmlinux_sha256"`
}

// QEMU is the emulator and how it ran: Accelerator is "tcg" or "kvm", and
// AccelReason says why (the KVM probe's result).
type QEMU struct {
	Version     string `json:"version"`
	Accelerator string `json:"accelerator"`
	AccelReason string `json:"accelerator_reason"`
}

// Binary is one executable in the guest image (or run against it).
type Binary struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Source pins the source the binaries were built from. GitTree is the
// git tree hash of the working tree as built (tracked and untracked,
// ignored files excepted); Dirty is true when it differs from GitHead's.
type Source struct {
	GitTree string `json:"git_tree"`
	GitHead string `json:"git_head"`
	Dirty   bool   `json:"dirty"`
}

// Tally recomputes the counts from the tests and the declared names.
func Tally(tests []Test, declared []string) Counts {
	c := Counts{Declared: len(declared)}
	for _, t := range tests {
		switch t.Result {
		case Pass, Fail:
			c.Executed++
			if t.Result == Fail {
				c.Failed++
			}
		case Skip:
			c.Ignored++
		}
	}
	return c
}

// Passed reports whether r shows a complete, clean run of its suite.
func (r *Receipt) Passed() bool { return r.Check(r.Suite) == nil }

// Summarize returns the one-line summary of r.
func (r *Receipt) Summarize() string {
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	c := r.Counts
	s := fmt.Sprintf("%s: %s %d executed / %d ignored / %d failed of %d declared; %s on %s, kernel %s; %s",
		r.Suite, verdict, c.Executed, c.Ignored, c.Failed, c.Declared, r.QEMU.Accelerator, qemuShort(r.QEMU.Version),
		orDash(r.Kernel.Release), r.Ended.Sub(r.Started).Round(time.Second))
	if len(r.Problems) > 0 {
		s += fmt.Sprintf("; %d problem(s): %s", len(r.Problems), firstLine(r.Problems[0]))
	}
	return s
}

func qemuShort(v string) string {
	if f := strings.Fields(v); len(f) > 0 {
		return "qemu " + f[0]
	}
	return "qemu ?"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// MaxBytes bounds a receipt file.
const MaxBytes = 32 << 20

// ErrReceipt wraps every failure to read a receipt.
var ErrReceipt = errors.New("receipt")

// Decode strictly decodes one receipt (admission/strictjson): unknown,
// duplicate or case-folded keys and trailing data are refused.
func Decode(data []byte) (*Receipt, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrReceipt, len(data), MaxBytes)
	}
	var r Receipt
	if err := strictjson.Decode(data, MaxBytes, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReceipt, err)
	}
	return &r, nil
}

// Encode returns r as indented JSON for a person, ending in a newline.
func Encode(r *Receipt) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Path returns the receipt file of suite in dir.
func Path(dir, suite string) string { return filepath.Join(dir, suite+".json") }

// Write fills r's counts and summary and writes it atomically to
// Path(dir, r.Suite).
func Write(dir string, r *Receipt) error {
	if r.Declared == nil {
		r.Declared = []string{}
	}
	r.Counts = Tally(r.Tests, r.Declared)
	if r.Problems == nil {
		r.Problems = []string{}
	}
	if r.Excluded == nil {
		r.Excluded = []Excluded{}
	}
	r.Summary = r.Summarize()
	data, err := Encode(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.Write(Path(dir, r.Suite), data, 0o644, atomicfile.Options{Temp: "." + r.Suite + ".*.tmp"})
}

// Read reads and decodes Path(dir, suite).
func Read(dir, suite string) (*Receipt, error) {
	f, err := os.Open(Path(dir, suite))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReceipt, err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, MaxBytes+1)); err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrReceipt, f.Name(), err)
	}
	return Decode(b.Bytes())
}
