package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/custodian/routine"
)

// routineCmds are the subcommands of `tether-custodian routine`.
var routineCmds = map[string]func([]string, io.Writer, io.Writer) int{
	"save": cmdRoutineSave, "show": cmdRoutineShow, "run": cmdRoutineRun}

// nameFirst splits NAME off the front of args, so that both
// `save NAME --from K` and `save --from K NAME` parse; it returns the
// flag arguments and the name ("" when args start with a flag).
func nameFirst(args []string) (string, []string) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:]
	}
	return "", args
}

// routineName returns the one routine name given before or after the
// flags, or "" when there is none or more than one.
func routineName(fs *flag.FlagSet, first string) string {
	switch {
	case first != "" && fs.NArg() == 0:
		return first
	case first == "" && fs.NArg() == 1:
		return fs.Arg(0)
	}
	return ""
}

// cmdRoutineSave saves a routine from a verified exec receipt of the
// config's principal, auditing the save.
func cmdRoutineSave(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("routine save", flag.ContinueOnError)
	config := fs.String("config", "", "the custodian config (required): its principal is the owner, its state_dir the store")
	from := fs.String("from", "", "op key of the verified exec receipt to save from (required)")
	replace := fs.Bool("replace", false, "overwrite a routine of the same name")
	usageFor(fs, "routine save NAME --from OP_KEY --config FILE [--replace]",
		"Saves the routine NAME (a-z, 0-9, _ and -) from the receipt of OP_KEY: an exec\n"+
			"(terminal/create) whose outcome is verified, recorded for the config's principal.\n"+
			"The template holds the command, its cwd relative to the root, its env and the\n"+
			"files to verify with their expected digests; never a tuple or a schedule. The\n"+
			"save, with the template's SHA-256, is appended to the audit log. The custodian\n"+
			"of the config must be stopped (its state directory is locked while it runs).")
	first, rest := nameFirst(args)
	if code, ok := parse(fs, rest, stdout, stderr); !ok {
		return code
	}
	name := routineName(fs, first)
	if name == "" || *config == "" || *from == "" {
		fs.Usage()
		return exitUsage
	}
	if err := routine.CheckName(name); err != nil {
		return fail(stderr, exitUsage, "routine save: %v", err)
	}
	cfg, err := custodian.LoadConfig(*config)
	if err != nil {
		return fail(stderr, exitUsage, "routine save: %v", err)
	}
	if cfg.OpStore != nil && cfg.OpStore.Kind == custodian.OpStoreEtcd {
		return fail(stderr, exitUsage, "routine save: op_store %q: routines are saved from the state directory's op key store only", cfg.OpStore.Kind)
	}
	return saveRoutine(cfg, name, *from, *replace, stdout, stderr)
}

func saveRoutine(cfg *custodian.Config, name, from string, replace bool, stdout, stderr io.Writer) int {
	key, err := credfile.Read(cfg.AuditKeyFile)
	if err != nil {
		return fail(stderr, exitRuntime, "routine save: audit key: %v", err)
	}
	c, err := custodian.New(custodian.Options{StateDir: cfg.StateDir, AuditKey: key})
	if errors.Is(err, opstore.ErrLocked) {
		return fail(stderr, exitRuntime, "routine save: a custodian runs on %s (%v); save once it has stopped", cfg.StateDir, err)
	}
	if err != nil {
		return fail(stderr, exitRuntime, "routine save: %v", err)
	}
	t, digest, err := c.SaveRoutine(name, from, cfg.Principal, replace)
	if cerr := c.Close(); err == nil && cerr != nil {
		return fail(stderr, exitRuntime, "routine save: close: %v", cerr)
	}
	if err != nil {
		return fail(stderr, exitFailed, "routine save: %v", err)
	}
	fmt.Fprintf(stdout, "saved routine %s from op key %s: sha256 %s\n", t.Name, from, digest)
	return exitOK
}

// cmdRoutineShow prints a routine's template exactly as stored.
func cmdRoutineShow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("routine show", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	usageFor(fs, "routine show NAME --state DIR",
		"Prints the template of routine NAME as stored (one JSON line; its SHA-256 is the\n"+
			"digest the audit log records for the save and each run).")
	first, rest := nameFirst(args)
	if code, ok := parse(fs, rest, stdout, stderr); !ok {
		return code
	}
	name := routineName(fs, first)
	if name == "" || *state == "" {
		fs.Usage()
		return exitUsage
	}
	if err := routine.CheckName(name); err != nil {
		return fail(stderr, exitUsage, "routine show: %v", err)
	}
	st, err := routine.ReadStore(*state)
	if err != nil {
		return fail(stderr, exitRuntime, "routine show: %v", err)
	}
	t, err := st.Load(name)
	if errors.Is(err, routine.ErrNotFound) {
		return fail(stderr, exitFailed, "routine show: %v", err)
	}
	if err != nil {
		return fail(stderr, exitRuntime, "routine show: %v", err)
	}
	data, err := t.Marshal()
	if err != nil {
		return fail(stderr, exitRuntime, "routine show: %v", err)
	}
	fmt.Fprintf(stdout, "%s\n", data)
	return exitOK
}

// cmdRoutineRun checks a run request and refuses it: a routine runs only
// on a session a running custodian has bound (Conn.RunRoutine), which
// this command cannot reach yet (docs/custodian.md "Routines").
func cmdRoutineRun(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("routine run", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	opKey := fs.String("op-key", "", "a fresh operation key for this run (required)")
	session := fs.String("session-id", "", "the bound session to run on (required)")
	usageFor(fs, "routine run NAME --op-key K --session-id ID --state DIR",
		"Runs routine NAME once on session ID of the custodian running on DIR, through the\n"+
			"agent's own custody path (admission, the session's current tuple, op key K,\n"+
			"a receipt). A retry of K replays its receipt and runs nothing.")
	first, rest := nameFirst(args)
	if code, ok := parse(fs, rest, stdout, stderr); !ok {
		return code
	}
	name := routineName(fs, first)
	if name == "" || *state == "" || *opKey == "" || *session == "" {
		fs.Usage()
		return exitUsage
	}
	if err := routine.CheckName(name); err != nil {
		return fail(stderr, exitUsage, "routine run: %v", err)
	}
	if !acpmeta.ValidOpKey(*opKey) {
		return fail(stderr, exitUsage, "routine run: op key %q is not well-formed", *opKey)
	}
	st, err := routine.ReadStore(*state)
	if err == nil {
		_, err = st.Load(name)
	}
	if err != nil {
		return fail(stderr, exitFailed, "routine run: %v", err)
	}
	return fail(stderr, exitRuntime, "routine run: no bound session: session %q is bound only inside the "+
		"`tether-custodian run` that serves it, and this command does not reach one; nothing was run", *session)
}
