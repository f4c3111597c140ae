package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
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
	// The config's retention, so opening the store to save prunes nothing
	// its own custodian would keep.
	c, err := custodian.New(custodian.Options{StateDir: cfg.StateDir, AuditKey: key, Retention: time.Duration(cfg.Retention)})
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

// cmdRoutineRun asks the custodian running on the state directory to run
// a routine once on one of its bound sessions (routine.Ask), and prints
// the run's receipt.
func cmdRoutineRun(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("routine run", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	opKey := fs.String("op-key", "", "a fresh operation key for this run (required)")
	session := fs.String("session-id", "", "the bound session to run on (required)")
	wait := fs.Duration("wait", time.Minute, "how long the running custodian may take to claim and run it")
	usageFor(fs, "routine run NAME --op-key K --session-id ID --state DIR [--wait D]",
		"Asks the custodian running on DIR (tether-custodian run) to run routine NAME once\n"+
			"on its bound session ID, through the agent's own custody path (admission, the\n"+
			"session's current tuple, op key K, a receipt), and prints the receipt. A retry of\n"+
			"K replays its receipt and runs nothing; K used for another request is\n"+
			"op_key_conflict. With no custodian running on DIR nothing runs. Exits 0 when the\n"+
			"run is verified, 1 when it is not or was refused.")
	first, rest := nameFirst(args)
	if code, ok := parse(fs, rest, stdout, stderr); !ok {
		return code
	}
	name := routineName(fs, first)
	if name == "" || *state == "" || *opKey == "" || *session == "" || *wait <= 0 {
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
	return askRun(*state, routine.RunRequest{Name: name, OpKey: *opKey, SessionID: *session}, *wait, stdout, stderr)
}

// askRun refuses when no custodian holds the state directory, else asks
// it and prints its answer.
func askRun(state string, req routine.RunRequest, wait time.Duration, stdout, stderr io.Writer) int {
	_, err := opstore.ReadOnly(filepath.Join(state, custodian.OpKeysDir))
	switch {
	case err == nil:
		return fail(stderr, exitRuntime, "routine run: no custodian runs on %s: a routine runs only on a session a running "+
			"`tether-custodian run` has bound; nothing was run", state)
	case !errors.Is(err, opstore.ErrLocked):
		return fail(stderr, exitRuntime, "routine run: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ans, err := routine.Ask(ctx, state, req, 50*time.Millisecond)
	if err != nil {
		return fail(stderr, exitRuntime, "routine run: %v (op key %s)", err, req.OpKey)
	}
	if ans.Receipt == nil {
		return fail(stderr, exitFailed, "routine run: refused: %s: %s", ans.Code, ans.Message)
	}
	fmt.Fprintf(stdout, "%s\n", ans.Receipt)
	r, err := opstore.Unmarshal(ans.Receipt)
	if err != nil || r.Outcome != opstore.Verified {
		return exitFailed
	}
	return exitOK
}

// serveRoutines answers `routine run` requests for conn's sessions until
// the returned stop is called (it waits for a run in progress to end).
func (r *runner) serveRoutines(ctx context.Context, conn *custodian.Conn) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := routine.Serve(ctx, r.cfg.StateDir, routine.DefaultPoll, func(ctx context.Context, req routine.RunRequest) routine.RunAnswer {
			return runAnswer(conn.RunRoutine(ctx, req.SessionID, req.Name, req.OpKey))
		})
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(r.stderr, "tether-custodian: routine runs are not served: %v\n", err)
		}
	}()
	return func() { cancel(); <-done }
}

// runAnswer is the answer to a run: its receipt as stored, or its refusal.
func runAnswer(rc *opstore.Receipt, err error) routine.RunAnswer {
	if err != nil {
		code, _ := acperr.CodeOf(err)
		return routine.RunAnswer{Code: string(code), Message: err.Error()}
	}
	data, err := rc.Marshal()
	if err != nil {
		return routine.RunAnswer{Code: "internal", Message: err.Error()}
	}
	return routine.RunAnswer{Receipt: data}
}
