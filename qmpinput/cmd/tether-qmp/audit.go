package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/qmpinput/auditlog"
)

const auditUsage = `usage: tether-qmp audit verify --state DIR [--checkpoint N:HASH]...

Checks the live view's hash-chained audit log: every line in the closed
schema (no content), seq counting from 1, each prev naming the line
before. --checkpoint pins an earlier head you kept (line N had HASH).
Prints {"ok","entries","head","kinds"}; exits 1 on any failure.
`

func cmdAudit(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, "tether-qmp audit", "no subcommand given")
	}
	if cli.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, auditUsage)
		return exitOK
	}
	if args[0] != "verify" {
		return cli.UsageError(stderr, "tether-qmp audit", "unknown subcommand %q", args[0])
	}
	fs := newFlagSet("audit verify", "audit verify --state DIR [--checkpoint N:HASH]...")
	state := fs.String("state", "", "the view's state directory (required)")
	var cps listFlag
	fs.Var(&cps, "checkpoint", "N:HASH, an earlier head the log must still contain (repeatable)")
	if code, ok := parse(fs, args[1:], stdout, stderr); !ok {
		return code
	}
	want, err := parseCheckpoints(cps)
	if err != nil {
		fmt.Fprintf(stderr, "audit verify: %v\n", err)
		return exitUsage
	}
	dir, err := openState(*state)
	if err != nil {
		return failToken(stdout, err)
	}
	defer dir.Close()
	s, err := auditlog.VerifyDir(dir, want)
	if err != nil {
		return failToken(stdout, err)
	}
	return emit(stdout, stderr, map[string]any{"ok": true, "entries": s.Entries, "head": s.Head, "kinds": s.Kinds})
}

func parseCheckpoints(cps []string) (map[int]string, error) {
	want := map[int]string{}
	for _, c := range cps {
		n, h, ok := strings.Cut(c, ":")
		line, err := strconv.Atoi(n)
		if !ok || err != nil || line < 1 || len(h) != 64 {
			return nil, fmt.Errorf("--checkpoint %q: want N:HASH (line number, 64 hex digits)", c)
		}
		want[line] = strings.ToLower(h)
	}
	return want, nil
}
