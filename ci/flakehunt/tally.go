// Package flakehunt runs tether's tests many times and counts, for each
// test, how often it failed: the flake hunt (ci/flakes, make flakes). It
// reads `go test -json` (cmd/test2json) and the VM suites' receipts, and
// writes a JSON report with a short summary. docs/ci.md says how to use it.
package flakehunt

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"strings"
)

// keepFailures is how many failures' output a test keeps in the report.
const keepFailures = 3

// tailLines is how many lines of a failure's output are kept.
const tailLines = 30

// event is one line of `go test -json`.
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events
	Test       string
	Output     string
}

// TestTally is what one test did over every run of the hunt.
type TestTally struct {
	Package  string   `json:"package"`
	Name     string   `json:"name"`
	Runs     int      `json:"runs"` // runs that reached a result (pass, fail or skip)
	Passes   int      `json:"passes"`
	Failures int      `json:"failures"`
	Skips    int      `json:"skips"`
	Outputs  []string `json:"failure_outputs,omitempty"` // the last lines of up to 3 failures
}

// Flaky reports whether the test both passed and failed.
func (t *TestTally) Flaky() bool { return t.Failures > 0 && t.Passes > 0 }

// PackageTally is what one package's test binary did: runs that failed
// outside any single test (a build failure, a panic, a timeout, a
// TestMain that failed) are counted here, with the output the package
// printed. A run that failed only because tests failed is not.
type PackageTally struct {
	Package  string   `json:"package"`
	Runs     int      `json:"runs"`
	Failures int      `json:"failures"`
	Outputs  []string `json:"failure_outputs,omitempty"`
}

// Tally counts results from test2json streams and receipts.
type Tally struct {
	tests map[string]*TestTally
	pkgs  map[string]*PackageTally
	out   map[string]*strings.Builder // output of the current run of each test
	open  map[string]map[string]bool  // package -> tests running, not yet finished
	fails map[string]int              // package -> tests failed in its current binary run
}

// NewTally returns an empty tally.
func NewTally() *Tally {
	return &Tally{tests: map[string]*TestTally{}, pkgs: map[string]*PackageTally{},
		out: map[string]*strings.Builder{}, open: map[string]map[string]bool{}, fails: map[string]int{}}
}

// Read adds every event of a `go test -json` stream; lines that are not
// events (text the go command prints itself) are copied to raw, as is
// every line, if raw is not nil.
func (ty *Tally) Read(r io.Reader, raw io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if raw != nil {
			raw.Write(append(sc.Bytes(), '\n'))
		}
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Action == "" {
			continue
		}
		ty.Add(e)
	}
	return sc.Err()
}

// Add counts one event.
func (ty *Tally) Add(e event) {
	if e.Package == "" {
		e.Package = e.ImportPath
	}
	if e.Test == "" {
		ty.addPackage(e)
		return
	}
	key := e.Package + " " + e.Test
	switch e.Action {
	case "run":
		ty.out[key] = &strings.Builder{}
		ty.opened(e.Package)[e.Test] = true
	case "output":
		if b := ty.out[key]; b != nil {
			b.WriteString(e.Output)
		}
	case "pass", "fail", "skip", "bench":
		delete(ty.opened(e.Package), e.Test)
		if e.Action == "fail" {
			ty.fails[e.Package]++
		}
		ty.result(e.Package, e.Test, e.Action, ty.text(key))
		delete(ty.out, key)
	}
}

func (ty *Tally) opened(pkg string) map[string]bool {
	if ty.open[pkg] == nil {
		ty.open[pkg] = map[string]bool{}
	}
	return ty.open[pkg]
}

func (ty *Tally) text(key string) string {
	if b := ty.out[key]; b != nil {
		return b.String()
	}
	return ""
}

// result records one finished run of a test.
func (ty *Tally) result(pkg, name, action, output string) {
	t := ty.test(pkg, name)
	t.Runs++
	switch action {
	case "pass", "bench": // "bench": a benchmark that logged (--- BENCH:) and passed
		t.Passes++
	case "skip":
		t.Skips++
	case "fail":
		t.Failures++
		if len(t.Outputs) < keepFailures {
			t.Outputs = append(t.Outputs, lastLines(output, tailLines))
		}
	}
}

func (ty *Tally) test(pkg, name string) *TestTally {
	key := pkg + " " + name
	t := ty.tests[key]
	if t == nil {
		t = &TestTally{Package: pkg, Name: name}
		ty.tests[key] = t
	}
	return t
}

// merge adds a test's tally from an earlier report (a ledger entry).
func (ty *Tally) merge(in TestTally) {
	t := ty.test(in.Package, in.Name)
	t.Runs += in.Runs
	t.Passes += in.Passes
	t.Failures += in.Failures
	t.Skips += in.Skips
	t.Outputs = keep(t.Outputs, in.Outputs)
}

// mergePackage adds a package's tally from an earlier report.
func (ty *Tally) mergePackage(in PackageTally) {
	p := ty.pkgs[in.Package]
	if p == nil {
		p = &PackageTally{Package: in.Package}
		ty.pkgs[in.Package] = p
	}
	p.Runs += in.Runs
	p.Failures += in.Failures
	p.Outputs = keep(p.Outputs, in.Outputs)
}

// keep appends failure outputs up to keepFailures.
func keep(have, more []string) []string {
	for _, o := range more {
		if len(have) == keepFailures {
			break
		}
		have = append(have, o)
	}
	return have
}

// addPackage counts a package's own events. A package that ends while
// tests are still running (a panic, the -timeout) fails those tests too:
// they never reached a result of their own.
func (ty *Tally) addPackage(e event) {
	key := e.Package + " "
	switch e.Action {
	case "start":
		ty.out[key] = &strings.Builder{}
	case "output", "build-output":
		if ty.out[key] == nil {
			ty.out[key] = &strings.Builder{}
		}
		ty.out[key].WriteString(e.Output)
	case "pass", "fail", "build-fail":
		p := ty.pkgs[e.Package]
		if p == nil {
			p = &PackageTally{Package: e.Package}
			ty.pkgs[e.Package] = p
		}
		p.Runs++
		cut := len(ty.open[e.Package]) > 0
		if e.Action != "pass" && (cut || ty.fails[e.Package] == 0) {
			p.Failures++
			if len(p.Outputs) < keepFailures {
				p.Outputs = append(p.Outputs, lastLines(ty.text(key), tailLines))
			}
		}
		ty.closeOpen(e.Package, e.Action == "pass")
		delete(ty.out, key)
		delete(ty.fails, e.Package)
	}
}

// closeOpen settles every test of pkg still running when its binary
// ended. A benchmark that passes quietly has no result event of its own
// (test2json gives one only for --- FAIL, --- SKIP and --- BENCH), so a
// benchmark still open when its package passed passed; anything else
// still open failed (a panic or the -timeout cut it off).
func (ty *Tally) closeOpen(pkg string, passed bool) {
	for name := range ty.open[pkg] {
		key := pkg + " " + name
		if passed && strings.HasPrefix(name, "Benchmark") {
			ty.result(pkg, name, "pass", "")
		} else {
			ty.result(pkg, name, "fail", ty.text(key)+"(the test binary ended before this test did: a panic or the -timeout)\n")
		}
		delete(ty.out, key)
	}
	delete(ty.open, pkg)
}

// Tests returns every test's tally, sorted by package and name.
func (ty *Tally) Tests() []TestTally {
	out := make([]TestTally, 0, len(ty.tests))
	for _, t := range ty.tests {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Package != out[j].Package {
			return out[i].Package < out[j].Package
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Packages returns every package's tally, sorted.
func (ty *Tally) Packages() []PackageTally {
	out := make([]PackageTally, 0, len(ty.pkgs))
	for _, p := range ty.pkgs {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Package < out[j].Package })
	return out
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
