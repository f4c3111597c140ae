package tools

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/plugin/shared"
	"github.com/tetherdev/tether/receiver/wire"
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

// runScript runs script with args and returns its whole output and exit
// code. A truncated output, a signal or no exit status is an error.
func runScript(ctx context.Context, c Call, script string, args ...string) (string, int, error) {
	res, err := RunCommand(ctx, c, Command{Command: "/bin/sh", Args: append([]string{"-c", script, "tether"}, args...),
		Env: []acp.EnvVariable{{Name: "LC_ALL", Value: "C"}}, OutputLimit: ShellOutputLimit})
	switch {
	case err != nil:
		return "", 0, err
	case res.Cancelled:
		return "", 0, fmt.Errorf("%w: the command was killed and its terminal released", shared.ErrCancelled)
	case res.TimedOut:
		return "", 0, wire.Errorf(wire.CodeTimeout, "command timed out before it finished")
	case res.Truncated:
		return "", 0, wire.Errorf(wire.CodeTooLarge, "output exceeds %d bytes; narrow the request", ShellOutputLimit)
	case res.ExitCode == nil:
		sig := "unknown"
		if res.Signal != nil {
			sig = *res.Signal
		}
		return "", 0, wire.Errorf(wire.CodeInternal, "command ended without an exit code (signal %s)", sig)
	}
	return res.Output, *res.ExitCode, nil
}

// Entry is one directory entry.
type Entry struct {
	Name string
	Type string // dir, file, symlink, other
}

// ListDirectory lists dir inside the computer with a terminal command; it
// never looks at host metadata.
func ListDirectory(ctx context.Context, c Call, dir string) (string, []Entry, error) {
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return "", nil, err
	}
	out, code, err := runScript(ctx, c, listScript, abs)
	if err != nil {
		return abs, nil, err
	}
	if code != 0 {
		return abs, nil, wire.Errorf(wire.CodeNotFound, "list_directory %s: exit %d: %s", abs, code, clip(out))
	}
	entries, err := ParseListing(out)
	return abs, entries, err
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
			return nil, wire.Errorf(wire.CodeInternal, "list_directory: malformed record %q", clip(rec))
		case typ != "dir" && typ != "file" && typ != "symlink" && typ != "other":
			return nil, wire.Errorf(wire.CodeInternal, "list_directory: unknown entry type %q", clip(typ))
		}
		entries = append(entries, Entry{Name: name, Type: typ})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	return entries, nil
}

// Glob returns the absolute paths below dir that match pattern (see Match),
// listed inside the computer.
func Glob(ctx context.Context, c Call, pattern, dir string) ([]string, error) {
	if err := ValidPattern(pattern); err != nil {
		return nil, err
	}
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return nil, err
	}
	out, code, err := runScript(ctx, c, findScript, abs)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, wire.Errorf(wire.CodeNotFound, "glob %s: exit %d: %s", abs, code, clip(out))
	}
	var matches []string
	for _, rec := range strings.Split(out, "\x00") {
		rel, ok := strings.CutPrefix(rec, "./")
		if ok && Match(pattern, rel) {
			matches = append(matches, path.Join(abs, rel))
		}
	}
	sort.Strings(matches)
	return matches, nil
}

// GrepOptions select grep's matching mode.
type GrepOptions struct {
	Fixed      bool // -F: pattern is a fixed string
	IgnoreCase bool // -i
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string // absolute
	Line int64
	Text string
}

// Grep searches dir inside the computer. Exit 1 (no match) is an empty
// result; any other non-zero exit is a failure, never a partial result.
func Grep(ctx context.Context, c Call, pattern, dir string, o GrepOptions) ([]GrepMatch, error) {
	if pattern == "" {
		return nil, wire.Errorf(wire.CodeInvalid, "grep: pattern is required")
	}
	abs, err := c.Resolve(orDot(dir))
	if err != nil {
		return nil, err
	}
	out, code, err := runScript(ctx, c, grepFlags(o), pattern, abs)
	switch {
	case err != nil:
		return nil, err
	case code == 1:
		return nil, nil
	case code != 0:
		return nil, wire.Errorf(wire.CodeNotFound, "grep %s: exit %d: %s", abs, code, clip(out))
	}
	return ParseGrep(abs, out)
}

func grepFlags(o GrepOptions) string {
	var f []string
	if o.Fixed {
		f = append(f, "-F")
	}
	if o.IgnoreCase {
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
			return nil, wire.Errorf(wire.CodeInternal, "grep: malformed line %q", clip(ln))
		}
		p, n, text, ok := splitGrepLine(rest)
		if !ok {
			return nil, wire.Errorf(wire.CodeInternal, "grep: malformed line %q", clip(ln))
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
