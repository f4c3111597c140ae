// Command testreport reads `go test -json` on stdin and prints a short
// report: the output of every failed test, every skip with its reason, and
// counts. It exits 1 if any test or package failed, or if any test was
// skipped while TETHER_TEST_REQUIRE is set (CI must not pass with skips).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

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

func main() { os.Exit(run(os.Stdin, os.Stdout)) }

func run(in io.Reader, out io.Writer) int {
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
	return r.print(out, os.Getenv("TETHER_TEST_REQUIRE") != "")
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
		fmt.Fprintf(out, "=== FAIL %s\n%s\n", k, r.output[k])
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

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
