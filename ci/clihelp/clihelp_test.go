// Package clihelp checks the one CLI convention (docs/decisions.md, "One
// CLI convention across the binaries", admission/cli) on the real
// binaries: it builds every command of the Makefile's CMDS once and runs
// -h, -help and --help on each, and on each subcommand listed below. Help
// must exit 0 with the usage on stdout, printed once, nothing on stderr,
// flags listed --name, one default per line and no Go "Usage of". An
// unknown flag must exit 2 with something on stderr and nothing on stdout.
package clihelp

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// subcommands are the subcommands whose help is checked too; a binary of
// CMDS not listed has none.
var subcommands = map[string][]string{
	"tether-admission":   {"keygen", "publish", "inspect", "coordinate"},
	"tether-custodian":   {"run", "receipts", "receipts show", "audit", "audit verify", "audit witness", "audit keygen", "routine", "routine save", "routine show", "routine run"},
	"tether-demo":        {"run", "up", "down", "admission"},
	"tether-qmp":         {"capture", "run", "verify-bundle", "view", "token", "token mint", "token revoke", "token list", "audit", "audit verify"},
	"tether-modelserver": {"anthropic", "gemini"},
	"tether-receiver":    {"check-caps"},
	"tether-computer":    {"create", "ls", "show", "rm", "renew", "suspend", "resume", "touch", "link", "demo-view", "receipts", "cp", "export", "import", "token", "token add", "egress", "egress show", "egress set", "egress verify"},
}

var (
	usageLine  = regexp.MustCompile(`(?mi)^usage:`)
	singleDash = regexp.MustCompile(`(?m)^\s+-[A-Za-z]`)
)

// cmds reads the CMDS variable of the Makefile (with its continuations).
func cmds(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "CMDS :="); ok {
			in, l = true, rest
		}
		if !in {
			continue
		}
		cont := strings.HasSuffix(strings.TrimSpace(l), `\`)
		out = append(out, strings.Fields(strings.TrimSuffix(strings.TrimSpace(l), `\`))...)
		if !cont {
			break
		}
	}
	if len(out) == 0 {
		t.Fatal("no CMDS in the Makefile")
	}
	return out
}

// build compiles every command of CMDS into one directory, in one go build.
func build(t *testing.T) (dir string, names []string) {
	t.Helper()
	dir = t.TempDir()
	pkgs := cmds(t)
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", pkgs, err, out)
	}
	for _, p := range pkgs {
		names = append(names, filepath.Base(p))
	}
	return dir, names
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs bin with args, outside any go-plugin host (no magic cookie).
func run(t *testing.T, bin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_PLUGIN_COOKIE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	r := result{stdout: out.String(), stderr: errb.String()}
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return r
}

// checkHelp reports every way r breaks the help convention.
func checkHelp(t *testing.T, what string, r result) {
	t.Helper()
	if r.code != 0 {
		t.Errorf("%s: exit %d, want 0", what, r.code)
	}
	if r.stderr != "" {
		t.Errorf("%s: stderr %q, want nothing", what, r.stderr)
	}
	if n := len(usageLine.FindAllString(r.stdout, -1)); n != 1 {
		t.Errorf("%s: %d usage lines on stdout, want 1:\n%s", what, n, r.stdout)
	}
	if strings.Contains(r.stdout, "Usage of") {
		t.Errorf("%s: Go's bare \"Usage of\":\n%s", what, r.stdout)
	}
	if m := singleDash.FindAllString(r.stdout, -1); m != nil {
		t.Errorf("%s: flags listed as -flag %q:\n%s", what, m, r.stdout)
	}
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Count(l, "(default") > 1 {
			t.Errorf("%s: two defaults on %q", what, l)
		}
	}
}

func TestEveryBinaryHelp(t *testing.T) {
	dir, names := build(t)
	if len(names) < 9 {
		t.Fatalf("CMDS lists %d commands, want at least 9: %v", len(names), names)
	}
	for _, name := range names {
		bin := filepath.Join(dir, name)
		for _, sub := range append([]string{""}, subcommands[name]...) {
			prefix := strings.Fields(sub)
			for _, h := range []string{"-h", "-help", "--help"} {
				args := append(append([]string{}, prefix...), h)
				checkHelp(t, name+" "+strings.Join(args, " "), run(t, bin, args...))
			}
			args := append(append([]string{}, prefix...), "--no-such-flag")
			r := run(t, bin, args...)
			what := name + " " + strings.Join(args, " ")
			if r.code != 2 || r.stderr == "" || r.stdout != "" {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want 2, nothing, an error", what, r.code, r.stdout, r.stderr)
			}
		}
	}
}
