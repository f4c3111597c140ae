package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestResolveAgentArgv: a relative program and the arguments naming a
// relative --jail-exec path become absolute (from the caller's working
// directory); everything else of the agent's command line is left alone.
func TestResolveAgentArgv(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	abs := func(p string) string { return filepath.Join(wd, p) }
	for _, c := range []struct {
		argv, exec, want []string
	}{
		{[]string{"bin/tether-hostagent", "--plugin", "bin/tether-plugin", "--principal", "alice"}, []string{"bin/tether-plugin"},
			[]string{abs("bin/tether-hostagent"), "--plugin", abs("bin/tether-plugin"), "--principal", "alice"}},
		{[]string{"./agent", "--plugin=./bin/tether-plugin", "bin/other"}, []string{"bin/tether-plugin"},
			[]string{abs("agent"), "--plugin=" + abs("bin/tether-plugin"), "bin/other"}},
		{[]string{"node", "dist/index.js", "bin/tether-plugin"}, nil, []string{"node", "dist/index.js", "bin/tether-plugin"}},
		{[]string{"/usr/bin/node", "/abs/x"}, []string{"/abs/x"}, []string{"/usr/bin/node", "/abs/x"}},
	} {
		got, err := resolveAgentArgv(c.argv, c.exec)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("resolveAgentArgv(%q, %q) = %q, %v; want %q", c.argv, c.exec, got, err, c.want)
		}
	}
}

// TestTailWriterKeepsTheLastLines: the kept tail is bounded and its last
// lines are what the error quotes.
func TestTailWriterKeepsTheLastLines(t *testing.T) {
	var tw tailWriter
	tw.Write([]byte(strings.Repeat("x", 3*stderrTailBytes) + "\n"))
	tw.Write([]byte("first\n\nsecond\nhash plugin: open bin/tether-plugin: no such file or directory\n"))
	if len(tw.buf) > stderrTailBytes {
		t.Fatalf("kept %d bytes, bound %d", len(tw.buf), stderrTailBytes)
	}
	if got, want := tw.lastLines(2), "second | hash plugin: open bin/tether-plugin: no such file or directory"; got != want {
		t.Fatalf("lastLines = %q, want %q", got, want)
	}
}
