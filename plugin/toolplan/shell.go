package toolplan

import (
	"path"
	"sort"
	"strconv"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// The scripts list_directory, glob and grep run inside the computer with
// /bin/sh. They are constants: caller input reaches them only as
// positional parameters, never as script text. They need only POSIX sh,
// find and grep (busybox has all three).
const (
	// listScript prints "TYPE/NAME\0" for each entry of $1.
	listScript = `cd "$1" || exit 2
for f in .* *; do
  case "$f" in .|..) continue;; esac
  if [ -L "$f" ]; then t=symlink
  elif [ -d "$f" ]; then t=dir
  elif [ -f "$f" ]; then t=file
  elif [ -e "$f" ]; then t=other
  else continue; fi
  printf '%s/%s\0' "$t" "$f"
done`
	// findScript prints every path below $1 as "./REL\0".
	findScript = `cd "$1" || exit 2
find . -mindepth 1 -print0`
	// grepScript searches $2 for $1; flags are chosen from a closed set.
	grepScript = `cd "$2" || exit 2
exec grep -rn %s -e "$1" .`
)

// ShellOutputLimit bounds the output of the scripts above; a truncated
// listing fails (too_large) rather than return a partial answer.
const ShellOutputLimit = 4 << 20

// shell plans the run of script with args in dir (resolved), with
// LC_ALL=C and the default PATH.
func (c Call) shell(dir, script string, args ...string) contract.TerminalStep {
	env := withDefaultPath([]acp.EnvVariable{{Name: "LC_ALL", Value: "C"}})
	st := c.terminal("/bin/sh", append([]string{"-c", script, "tether"}, args...), env, ShellOutputLimit)
	st.Cwd, st.Dir = c.Root, dir
	return st
}

// ShellRun is how a shell tool's command ended, as the host saw it.
type ShellRun struct {
	Output    string
	Truncated bool
	TimedOut  bool
	ExitCode  *int
	Signal    *string
}

// checked returns the whole output and the exit code. A timeout, a
// truncated output, a signal or no exit status is an error.
func (r ShellRun) checked() (string, int, error) {
	switch {
	case r.TimedOut:
		return "", 0, errcode.Errorf(errcode.CodeTimeout, "command timed out before it finished")
	case r.Truncated:
		return "", 0, errcode.Errorf(errcode.CodeTooLarge, "output exceeds %d bytes; narrow the request", ShellOutputLimit)
	case r.ExitCode == nil:
		sig := "unknown"
		if r.Signal != nil {
			sig = *r.Signal
		}
		return "", 0, errcode.Errorf(errcode.CodeInternal, "command ended without an exit code (signal %s)", sig)
	}
	return r.Output, *r.ExitCode, nil
}

// Entry is one directory entry.
type Entry struct {
	Name string
	Type string // dir, file, symlink, other
}

// List plans list_directory: a terminal command lists dir inside the
// computer; host metadata is never looked at.
func (c Call) List(dir string) (contract.TerminalStep, error) {
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return contract.TerminalStep{}, err
	}
	return c.shell(abs, listScript, abs), nil
}

// FinishList is list_directory's result from its run in dir.
func FinishList(dir string, r ShellRun) ([]Entry, error) {
	out, code, err := r.checked()
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, errcode.Errorf(errcode.CodeNotFound, "list_directory %s: exit %d: %s", dir, code, clip(out))
	}
	return ParseListing(out)
}

// ParseListing parses listScript's output; it is strict: an unknown type, an
// empty name or a name with a slash is an error.
func ParseListing(out string) ([]Entry, error) {
	var entries []Entry
	for _, rec := range strings.Split(out, "\x00") {
		if rec == "" {
			continue
		}
		typ, name, ok := strings.Cut(rec, "/")
		switch {
		case !ok || name == "" || strings.Contains(name, "/"):
			return nil, errcode.Errorf(errcode.CodeInternal, "list_directory: malformed record %q", clip(rec))
		case typ != "dir" && typ != "file" && typ != "symlink" && typ != "other":
			return nil, errcode.Errorf(errcode.CodeInternal, "list_directory: unknown entry type %q", clip(typ))
		}
		entries = append(entries, Entry{Name: name, Type: typ})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	return entries, nil
}

// Glob plans glob: every path below dir is listed inside the computer;
// FinishGlob keeps those that match pattern (see Match).
func (c Call) Glob(pattern, dir string) (contract.TerminalStep, error) {
	if err := ValidPattern(pattern); err != nil {
		return contract.TerminalStep{}, err
	}
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return contract.TerminalStep{}, err
	}
	return c.shell(abs, findScript, abs), nil
}

// FinishGlob is glob's result from its run in dir: the absolute paths
// that match pattern, sorted.
func FinishGlob(dir, pattern string, r ShellRun) ([]string, error) {
	if err := ValidPattern(pattern); err != nil {
		return nil, err
	}
	out, code, err := r.checked()
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, errcode.Errorf(errcode.CodeNotFound, "glob %s: exit %d: %s", dir, code, clip(out))
	}
	var matches []string
	for _, rec := range strings.Split(out, "\x00") {
		rel, ok := strings.CutPrefix(rec, "./")
		if ok && Match(pattern, rel) {
			matches = append(matches, path.Join(dir, rel))
		}
	}
	sort.Strings(matches)
	return matches, nil
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string // absolute
	Line int64
	Text string
}

// Grep plans grep below dir; fixed (-F) and ignoreCase (-i) select the
// flags from a closed set.
func (c Call) Grep(pattern, dir string, fixed, ignoreCase bool) (contract.TerminalStep, error) {
	if pattern == "" {
		return contract.TerminalStep{}, errcode.Errorf(errcode.CodeInvalid, "grep: pattern is required")
	}
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return contract.TerminalStep{}, err
	}
	return c.shell(abs, grepFlags(fixed, ignoreCase), pattern, abs), nil
}

// FinishGrep is grep's result from its run in dir. Exit 1 (no match) is
// an empty result; any other non-zero exit is a failure, never a partial
// result.
func FinishGrep(dir string, r ShellRun) ([]GrepMatch, error) {
	out, code, err := r.checked()
	switch {
	case err != nil:
		return nil, err
	case code == 1:
		return nil, nil
	case code != 0:
		return nil, errcode.Errorf(errcode.CodeNotFound, "grep %s: exit %d: %s", dir, code, clip(out))
	}
	return ParseGrep(dir, out)
}

func grepFlags(fixed, ignoreCase bool) string {
	var f []string
	if fixed {
		f = append(f, "-F")
	}
	if ignoreCase {
		f = append(f, "-i")
	}
	return strings.Replace(grepScript, "%s", strings.Join(f, " "), 1)
}

// ParseGrep parses `grep -rn ... .` output: "./PATH:LINE:TEXT" per line. The
// path ends at the first ":<digits>:" after "./"; a path that itself holds
// such a sequence is reported under its shorter prefix (documented limit).
func ParseGrep(dir, out string) ([]GrepMatch, error) {
	var ms []GrepMatch
	for _, ln := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if ln == "" {
			continue
		}
		rest, ok := strings.CutPrefix(ln, "./")
		if !ok {
			return nil, errcode.Errorf(errcode.CodeInternal, "grep: malformed line %q", clip(ln))
		}
		p, n, text, ok := splitGrepLine(rest)
		if !ok {
			return nil, errcode.Errorf(errcode.CodeInternal, "grep: malformed line %q", clip(ln))
		}
		ms = append(ms, GrepMatch{Path: path.Join(dir, p), Line: n, Text: text})
	}
	return ms, nil
}

func splitGrepLine(s string) (p string, n int64, text string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != ':' || i == 0 {
			continue
		}
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i+1 || j >= len(s) || s[j] != ':' {
			continue
		}
		v, err := strconv.ParseInt(s[i+1:j], 10, 64)
		if err != nil || v < 1 {
			continue
		}
		return s[:i], v, s[j+1:], true
	}
	return "", 0, "", false
}

func clip(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
