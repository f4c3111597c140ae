package vmsuite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"unicode/utf8"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/ci/receipt"
)

// outputTail bounds the output a receipt keeps per failed or skipped test.
const outputTail = 4 << 10

// event is one line of cmd/test2json output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// Convert turns the raw `-test.v=test2json` output of one test binary into
// events with `go tool test2json` (the converter `go test -json` uses).
func Convert(ctx context.Context, pkg string, raw []byte) ([]event, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "test2json", "-t", "-p", pkg) // -t also enables Elapsed
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool test2json: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var evs []event
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("go tool test2json printed a malformed event: %w", err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// StepTests is what one test binary's run says: its tests, and the
// problems no single test carries.
type StepTests struct {
	Tests    []receipt.Test
	Problems []string
}

// TestsOf turns one step's events into receipt tests. A test that started
// but never ended (the binary crashed or was killed) is a failure; a
// binary that did not exit 0 without any failing test, or that left
// declared tests unrun, is a problem.
func TestsOf(rel string, evs []event, exit *guestrun.Exit, declared []string) StepTests {
	var st StepTests
	order := []string{}
	byName := map[string]*receipt.Test{}
	var pkgOut strings.Builder
	for _, e := range evs {
		if e.Test == "" {
			if e.Action == "output" {
				pkgOut.WriteString(e.Output)
			}
			continue
		}
		t := byName[e.Test]
		if t == nil {
			t = &receipt.Test{Package: rel, Name: e.Test}
			byName[e.Test] = t
			order = append(order, e.Test)
		}
		switch e.Action {
		case "output":
			t.Output = keepTail(t.Output + e.Output)
		case "pass", "fail", "skip":
			t.Result, t.ElapsedS = receipt.Result(e.Action), e.Elapsed
		}
	}
	failed := false
	for _, name := range order {
		t := byName[name]
		if t.Result == "" {
			t.Result = receipt.Fail
			t.Output = keepTail(t.Output + fmt.Sprintf("\n[ci/vmsuite: the test never finished; the binary %s]\n", exit))
		}
		if t.Result == receipt.Pass {
			t.Output = "" // only failures and skips keep their output
		}
		failed = failed || t.Result == receipt.Fail
		st.Tests = append(st.Tests, *t)
	}
	if !exit.OK() && !failed {
		st.Problems = append(st.Problems, fmt.Sprintf("%s: the test binary %s without a failing test:\n%s",
			rel, exit, keepTail(pkgOut.String())))
	}
	if missing := unrun(declared, byName); len(missing) > 0 {
		st.Problems = append(st.Problems, fmt.Sprintf("%s: %d declared tests never ran: %s",
			rel, len(missing), strings.Join(missing, ", ")))
	}
	return st
}

func unrun(declared []string, ran map[string]*receipt.Test) []string {
	var out []string
	for _, d := range declared {
		if ran[d] == nil {
			out = append(out, d)
		}
	}
	return out
}

// keepTail keeps the last outputTail bytes of s, cut on a rune boundary.
func keepTail(s string) string {
	if len(s) <= outputTail {
		return s
	}
	i := len(s) - outputTail
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "…" + s[i:]
}
