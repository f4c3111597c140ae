package flakehunt

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// ReportName is the report's file name in the output directory.
const ReportName = "report.json"

// Report is the flake hunt's record: how it ran, and every test's and
// package's tally. A test that failed once is a finding, whether it also
// passed (flaky) or never did (broken).
type Report struct {
	Summary  []string       `json:"summary"` // the lines printed for a person
	Totals   Totals         `json:"totals"`
	Config   Config         `json:"config"`
	Started  time.Time      `json:"started"`
	Ended    time.Time      `json:"ended"`
	Spent    time.Duration  `json:"spent_ns,omitempty"` // a ledger sum: the entries' hunts added up
	Failed   []TestTally    `json:"failed_tests"`       // every test that failed at least once
	PkgFails []PackageTally `json:"failed_packages"`    // every package with a failure outside a test
	VM       []VMRun        `json:"vm_runs,omitempty"`
	Packages []PackageTally `json:"packages"` // every package's runs, failures or not
	Tests    []TestTally    `json:"tests"`    // every test, failures or not
}

// Config says how the hunt ran.
type Config struct {
	GoTest   []string `json:"go_test"` // the go test command of each round
	Count    int      `json:"count"`
	Rounds   int      `json:"rounds"`
	Race     bool     `json:"race"`
	UID      int      `json:"uid"`
	Require  string   `json:"tether_test_require"`
	VMRuns   int      `json:"vm_runs"`
	VMArgs   []string `json:"vm_args,omitempty"`
	GitHead  string   `json:"git_head"`
	Dirty    bool     `json:"dirty"`
	NumCPU   int      `json:"num_cpu"`
	LoadAvg  string   `json:"load_avg_at_start"`
	Packages []string `json:"packages"`
	Inputs   []string `json:"inputs,omitempty"`         // earlier go test -json files counted too
	Entries  int      `json:"ledger_entries,omitempty"` // a ledger sum: the entries added up
	Hog      int      `json:"hog,omitempty"`            // busy loops run beside the hunt (-hog)
	// CgoEnabled is the CGO_ENABLED of the go test rounds ("0" or "1");
	// empty without rounds, and in entries filed before it was recorded.
	CgoEnabled string `json:"cgo_enabled,omitempty"`
}

// Totals count the hunt's results.
type Totals struct {
	Tests           int `json:"tests"`
	TestRuns        int `json:"test_runs"`
	Failures        int `json:"failures"`
	FailedTests     int `json:"failed_tests"`
	FlakyTests      int `json:"flaky_tests"` // failed and passed
	PackageRuns     int `json:"package_runs"`
	PackageFailures int `json:"package_failures"`
	VMRuns          int `json:"vm_runs"`
	VMFailedRuns    int `json:"vm_failed_runs"`
}

// build fills the report from the tally.
func (r *Report) build(ty *Tally) {
	r.Tests = ty.Tests()
	r.Packages, r.Failed, r.PkgFails = ty.Packages(), nil, nil
	r.Totals = Totals{Tests: len(r.Tests), VMRuns: len(r.VM)}
	for _, t := range r.Tests {
		r.Totals.TestRuns += t.Runs
		r.Totals.Failures += t.Failures
		if t.Failures > 0 {
			r.Failed = append(r.Failed, t)
			r.Totals.FailedTests++
		}
		if t.Flaky() {
			r.Totals.FlakyTests++
		}
	}
	for _, p := range r.Packages {
		r.Totals.PackageRuns += p.Runs
		if p.Failures > 0 {
			r.PkgFails = append(r.PkgFails, p)
			r.Totals.PackageFailures += p.Failures
		}
	}
	for _, v := range r.VM {
		if !v.Passed {
			r.Totals.VMFailedRuns++
		}
	}
	r.Summary = r.summarize()
}

// Clean reports whether nothing failed: no test, no package, no VM run.
func (r *Report) Clean() bool {
	return r.Totals.Failures == 0 && r.Totals.PackageFailures == 0 && r.Totals.VMFailedRuns == 0
}

func (r *Report) summarize() []string {
	c, tt := r.Config, r.Totals
	verdict := "CLEAN"
	if !r.Clean() {
		verdict = "FAILURES"
	}
	race := ""
	if c.Race {
		race = ", -race"
	}
	how := fmt.Sprintf("-count %d x %d rounds%s", c.Count, c.Rounds, race)
	if c.Rounds == 0 {
		how = "no go test rounds"
	}
	if c.Entries > 0 {
		how = fmt.Sprintf("%d ledger entries added up", c.Entries)
	}
	if c.CgoEnabled == "0" {
		how += ", CGO_ENABLED=0"
	}
	if c.Hog > 0 {
		how += fmt.Sprintf(", %d busy loops beside", c.Hog)
	}
	if len(c.Inputs) > 0 {
		how += fmt.Sprintf(", plus %d earlier go test -json files", len(c.Inputs))
	}
	if c.UID >= 0 {
		how += fmt.Sprintf(", uid %d", c.UID)
	}
	out := []string{fmt.Sprintf("flakes: %s: %d tests, %d runs (%s), %d failures in %d tests (%d flaky); %d package failures in %d package runs; %s",
		verdict, tt.Tests, tt.TestRuns, how, tt.Failures, tt.FailedTests, tt.FlakyTests,
		tt.PackageFailures, tt.PackageRuns, r.duration().Round(time.Second))}
	for _, t := range r.Failed {
		out = append(out, fmt.Sprintf("  FAIL %d/%d %s %s", t.Failures, t.Runs, t.Package, t.Name))
	}
	for _, p := range r.PkgFails {
		out = append(out, fmt.Sprintf("  PACKAGE FAIL %d/%d %s: %s", p.Failures, p.Runs, p.Package, lastLine(p.Outputs)))
	}
	if tt.VMRuns > 0 {
		out = append(out, fmt.Sprintf("vm: %d runs of ci/vm-receipts, %d failed", tt.VMRuns, tt.VMFailedRuns))
		for _, v := range r.VM {
			for _, s := range v.Summaries {
				out = append(out, fmt.Sprintf("  run %d: %s", v.Run, s))
			}
		}
	}
	return out
}

func lastLine(outputs []string) string {
	if len(outputs) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(outputs[0]), "\n")
	return lines[len(lines)-1]
}

// Write writes the report as indented JSON to dir/report.json, through a
// temporary file so a reader never sees half a report.
func (r *Report) Write(dir string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, ReportName), data)
}

// writeFile writes data and a newline to name with atomicfile.Write, so a
// reader never sees half a report.
func writeFile(name string, data []byte) error {
	return atomicfile.Write(name, append(data, '\n'), 0o644, atomicfile.Options{})
}

// Print writes the summary lines to w.
func (r *Report) Print(w io.Writer) {
	for _, l := range r.Summary {
		fmt.Fprintln(w, l)
	}
}
