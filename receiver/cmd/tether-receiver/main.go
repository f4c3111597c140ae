// Command tether-receiver is the daemon inside a computer: it serves the
// receiver wire protocol as root with exactly seven capabilities, runs
// file operations beneath grant roots and children as grant users.
//
//	tether-receiver --config FILE   run the daemon (docs/protocol.md "Config")
//	tether-receiver check-caps      check the start-up capabilities and exit
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/receiver"
	"github.com/tetherdev/tether/receiver/caps"
	"github.com/tetherdev/tether/receiver/spawn"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == spawn.HelperArg {
		spawn.HelperMain() // a child being started in helper mode; never returns
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usageText = `Runs the receiver daemon; docs/protocol.md ("Config") describes FILE.

  tether-receiver check-caps   checks uid 0 and the seven capabilities, prints the result`

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // a check or the daemon failed
	exitUsage   = 2
	exitMissing = 3 // check-caps: a capability is missing or not uid 0
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check-caps" {
		return checkCaps(args[1:], stdout, stderr)
	}
	fs := cli.NewFlagSet("tether-receiver", "tether-receiver --config FILE", usageText)
	config := fs.String("config", "", "daemon configuration `FILE` (JSON)")
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if *config == "" {
		return cli.UsageError(stderr, fs.Name(), "--config is required")
	}
	if fs.NArg() > 0 {
		return cli.UsageError(stderr, fs.Name(), "unexpected argument %q", fs.Arg(0))
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	if err := runDaemon(ctx, *config, log); err != nil {
		log.Error("tether-receiver: refusing to run", "err", err)
		return exitFailed
	}
	return exitOK
}

// runDaemon marks inherited descriptors close-on-exec and checks the
// capabilities before anything else, then loads the config and runs.
func runDaemon(ctx context.Context, path string, log *slog.Logger) error {
	if err := markInheritedCloexec(); err != nil {
		return fmt.Errorf("start-up check: %w", err)
	}
	if err := caps.Check(); err != nil {
		return fmt.Errorf("start-up check: %w", err)
	}
	cfg, err := receiver.LoadConfig(path)
	if err != nil {
		return err
	}
	return receiver.Run(ctx, cfg, log)
}

func checkCaps(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("tether-receiver check-caps", "tether-receiver check-caps",
		"Checks that this process runs as uid 0 with CHOWN, DAC_OVERRIDE, FOWNER,\n"+
			"KILL, SETGID, SETUID and SETPCAP in its effective, permitted and bounding\n"+
			"sets, prints each, and exits 0 only when all are present (3 otherwise).")
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		return cli.UsageError(stderr, fs.Name(), "unexpected argument %q", fs.Arg(0))
	}
	err := caps.Check()
	printCaps(stdout, err)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, caps.ErrMissing), errors.Is(err, caps.ErrNotRoot):
		return exitMissing
	}
	fmt.Fprintln(stderr, "check-caps:", err)
	return exitFailed
}

// printCaps prints one line per required capability and a verdict.
func printCaps(w io.Writer, err error) {
	missing := map[string][]string{}
	var me *caps.MissingError
	if errors.As(err, &me) {
		for _, m := range me.Missing {
			missing[m.Cap] = m.Sets
		}
	}
	for _, c := range caps.Required {
		name := caps.Name(c)
		if sets, ok := missing[name]; ok {
			fmt.Fprintf(w, "%-13s MISSING from %s\n", name, strings.Join(sets, ", "))
		} else if err == nil || me != nil {
			fmt.Fprintf(w, "%-13s ok\n", name)
		}
	}
	if err != nil {
		fmt.Fprintf(w, "FAIL: %v\n", err)
		return
	}
	fmt.Fprintln(w, "OK: uid 0 with all seven capabilities")
}
