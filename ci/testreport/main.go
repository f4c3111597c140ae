// Command testreport reads `go test -json` on stdin and prints a short
// report: the last 30 lines of output of every failed test, every skip
// with its reason, and counts. With -failures FILE it also writes every
// failed test's whole output to FILE, so one CI failure is enough to
// diagnose (make test keeps it in .cache/ beside test.json). It exits 1 if
// any test or package failed, or if any test was skipped while
// TETHER_TEST_REQUIRE is set (CI must not pass with skips).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// failTail is how many lines of a failed test's output the report prints.
const failTail = 30

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type report struct {
	output  map[string]*strings.Builder
	pass    int
	fail    []string
	skip    []string
	pkgFail []string
	pkgs    int
	benches int // benchmarks (and their sub-benchmarks) started; they report no pass
}

func main() {
	failures := flag.String("failures", "", "write every failed test's whole output to this file")
	flag.Parse()
	os.Exit(run(os.Stdin, os.Stdout, *failures))
}

// run reports in on out, writes the failures file if one is named, and
// returns the exit status.
func run(in io.Reader, out io.Writer, failures string) int {
	r := read(in, out)
	rc := r.print(out, os.Getenv("TETHER_TEST_REQUIRE") != "")
	if failures == "" {
		return rc
	}
	if err := r.writeFailures(failures); err != nil {
		fmt.Fprintf(out, "testreport: %v\n", err)
		return 1
	}
	fmt.Fprintf(out, "testreport: failed tests' whole output is in %s\n", failures)
	return rc
}

// read collects the events of in; lines that are not events (build
// errors arrive as plain text) are copied to out at once.
func read(in io.Reader, out io.Writer) *report {
	r := &report{output: map[string]*strings.Builder{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(out, sc.Text()) // build errors arrive as plain text
			continue
		}
		r.add(e)
	}
	return r
}

func (r *report) add(e event) {
	key := e.Package + " " + e.Test
	switch e.Action {
	case "run":
		if strings.HasPrefix(e.Test, "Benchmark") {
			r.benches++
		}
	case "output":
		b := r.output[key]
		if b == nil {
			b = &strings.Builder{}
			r.output[key] = b
		}
		b.WriteString(e.Output)
	case "pass":
		if e.Test == "" {
			r.pkgs++
			return
		}
		r.pass++
	case "fail":
		if e.Test == "" {
			r.pkgs++
			r.pkgFail = append(r.pkgFail, e.Package)
			return
		}
		r.fail = append(r.fail, key)
	case "skip":
		if e.Test != "" {
			r.skip = append(r.skip, key)
		}
	}
}

func (r *report) print(out io.Writer, strict bool) int {
	for _, k := range r.fail {
		text, cut := tailLines(r.text(k), failTail)
		if cut > 0 {
			fmt.Fprintf(out, "=== FAIL %s (last %d lines; %d earlier lines are in the full output)\n%s\n", k, failTail, cut, text)
			continue
		}
		fmt.Fprintf(out, "=== FAIL %s\n%s\n", k, text)
	}
	for _, p := range r.pkgFail {
		if b := r.output[p+" "]; b != nil {
			fmt.Fprintf(out, "=== package %s\n%s\n", p, tail(b.String(), 60))
		}
	}
	sort.Strings(r.skip)
	for _, k := range r.skip {
		fmt.Fprintf(out, "--- SKIP %s: %s\n", k, lastLine(r.output[k]))
	}
	fmt.Fprintf(out, "tests: %d passed, %d failed, %d skipped in %d packages (%d failed); %d benchmarks run\n",
		r.pass, len(r.fail), len(r.skip), r.pkgs, len(r.pkgFail), r.benches)
	switch {
	case len(r.fail) > 0 || len(r.pkgFail) > 0:
		return 1
	case strict && len(r.skip) > 0:
		fmt.Fprintln(out, "FAIL: TETHER_TEST_REQUIRE is set and tests were skipped")
		return 1
	}
	return 0
}

func lastLine(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	for _, l := range reverse(strings.Split(strings.TrimSpace(b.String()), "\n")) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--- SKIP") {
			return l
		}
	}
	return ""
}

func reverse(s []string) []string {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}

// tailLines returns the last n lines of s and how many lines it left out.
func tailLines(s string, n int) (string, int) {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) <= n {
		return s, 0
	}
	return strings.Join(lines[len(lines)-n:], ""), len(lines) - n
}

// writeFailures writes the whole output of every failed test and failed
// package to path (an empty file when nothing failed, so a stale one
// never survives).
func (r *report) writeFailures(path string) error {
	var b strings.Builder
	for _, k := range r.fail {
		fmt.Fprintf(&b, "=== FAIL %s\n%s\n", k, r.text(k))
	}
	for _, p := range r.pkgFail {
		fmt.Fprintf(&b, "=== package %s\n%s\n", p, r.text(p+" "))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// text is the whole output of key ("package test"), empty if none.
func (r *report) text(key string) string {
	if b := r.output[key]; b != nil {
		return b.String()
	}
	return ""
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
