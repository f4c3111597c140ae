package host_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocQuotesHostExample: docs/plugin.md's Go host is the compiled
// hostSession (example_test.go), line for line, and at most fifteen lines,
// so the snippet cannot rot into code that ignores errors or no longer
// compiles.
func TestDocQuotesHostExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "\t// doc:begin\n")
	body, _, ok2 := strings.Cut(rest, "\t// doc:end\n")
	if !ok || !ok2 {
		t.Fatal("example_test.go lost its doc:begin/doc:end markers")
	}
	var want []string
	for _, line := range strings.SplitAfter(body, "\n") {
		want = append(want, strings.TrimPrefix(line, "\t"))
	}
	doc, err := os.ReadFile("../../docs/plugin.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## A Go host in fifteen lines\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/plugin.md has no Go block under \"A Go host in fifteen lines\"")
	}
	if got := strings.Join(want, ""); block != got {
		t.Fatalf("docs/plugin.md quotes\n%s\nbut example_test.go compiles\n%s", block, got)
	}
	if n := strings.Count(block, "\n"); n > 15 {
		t.Fatalf("the Go host is %d lines; the issue allows 15", n)
	}
}
