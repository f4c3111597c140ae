package cli

import (
	"bytes"
	"strings"
	"testing"
)

func newTest() (*bytes.Buffer, *bytes.Buffer, func(args ...string) (int, bool)) {
	var out, errb bytes.Buffer
	return &out, &errb, func(args ...string) (int, bool) {
		fs := NewFlagSet("prog sub", "prog sub --dir DIR", "Does a thing.")
		fs.String("dir", "", "a directory")
		fs.Int("gid", -1, "a gid (default: the same number as --uid)")
		fs.Int("n", 3, "a count")
		fs.String("mode", "fast", "a mode")
		fs.Bool("once", false, "run once")
		return Parse(fs, args, &out, &errb)
	}
}

func TestHelpOnStdoutOnce(t *testing.T) {
	for _, h := range []string{"-h", "-help", "--help"} {
		out, errb, parse := newTest()
		code, done := parse(h)
		if code != ExitOK || !done {
			t.Fatalf("%s: code %d done %v, want 0 true", h, code, done)
		}
		if errb.Len() != 0 {
			t.Fatalf("%s: stderr %q, want empty", h, errb)
		}
		s := out.String()
		if strings.Count(s, "usage: prog sub --dir DIR") != 1 {
			t.Fatalf("%s: usage not printed once:\n%s", h, s)
		}
		for _, want := range []string{"  --dir string\n", "  --gid int\n", "(default 3)", `(default "fast")`, "  --once\n"} {
			if !strings.Contains(s, want) {
				t.Errorf("%s: no %q in\n%s", h, want, s)
			}
		}
		for _, line := range strings.Split(s, "\n") {
			if strings.Count(line, "(default") > 1 {
				t.Errorf("%s: two defaults on %q", h, line)
			}
			if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
				t.Errorf("%s: flag spelled -name: %q", h, line)
			}
		}
	}
}

func TestFlagErrorHint(t *testing.T) {
	out, errb, parse := newTest()
	code, done := parse("--nope")
	if code != ExitUsage || !done {
		t.Fatalf("code %d done %v, want 2 true", code, done)
	}
	if out.Len() != 0 {
		t.Fatalf("stdout %q, want empty", out)
	}
	want := "flag provided but not defined: -nope\nrun \"prog sub --help\" for usage\n"
	if errb.String() != want {
		t.Fatalf("stderr %q, want %q", errb.String(), want)
	}
}

func TestParseGoesOn(t *testing.T) {
	_, errb, parse := newTest()
	if code, done := parse("--dir", "x"); code != ExitOK || done || errb.Len() != 0 {
		t.Fatalf("code %d done %v stderr %q, want 0 false empty", code, done, errb)
	}
}

func TestUsageError(t *testing.T) {
	var errb bytes.Buffer
	if code := UsageError(&errb, "prog", "--dir is required"); code != ExitUsage {
		t.Fatalf("code %d, want 2", code)
	}
	if want := "prog: --dir is required\nrun \"prog --help\" for usage\n"; errb.String() != want {
		t.Fatalf("stderr %q, want %q", errb.String(), want)
	}
}
