package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // a prompt did not end with end_turn, a check failed
	exitUsage   = 2 // bad flags or config
	exitRuntime = 3 // could not start (state, credentials, agent)
)

const usage = `tether-custodian: the ACP client side of tether.

Usage:
  tether-custodian run --config FILE [--agent PROFILE] [--session-id ID] [--prompt TEXT]... -- AGENT_CMD [ARGS...]
  tether-custodian agents
  tether-custodian receipts show (--state DIR | --config FILE) [--key K] [--wait D]
  tether-custodian routine save NAME --from OP_KEY --config FILE [--replace]
  tether-custodian routine show NAME --state DIR
  tether-custodian routine run NAME --op-key K --session-id ID --state DIR
  tether-custodian audit verify --state DIR --pubkey FILE [--checkpoint FILE] [--witness KEY... [--witness-quorum K]]
  tether-custodian audit witness --state DIR --pubkey FILE --witness URL=KEY... [--quorum K]
  tether-custodian audit keygen --name NAME --out PREFIX

Every subcommand takes --help. docs/custodian.md describes the config file,
receipts and audit verification.
`

// run dispatches a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "run":
		return cmdRun(ctx, rest, stdin, stdout, stderr)
	case "agents":
		return cmdAgents(rest, stdout, stderr)
	case "receipts":
		return sub(rest, stdout, stderr, "receipts", map[string]func([]string, io.Writer, io.Writer) int{"show": cmdReceiptsShow})
	case "routine":
		return sub(rest, stdout, stderr, "routine", routineCmds)
	case "audit":
		return sub(rest, stdout, stderr, "audit", map[string]func([]string, io.Writer, io.Writer) int{
			"verify": cmdAuditVerify, "keygen": cmdAuditKeygen, "witness": cmdAuditWitness})
	default:
		fmt.Fprintf(stderr, "tether-custodian: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
}

func sub(args []string, stdout, stderr io.Writer, group string, cmds map[string]func([]string, io.Writer, io.Writer) int) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(stderr, "usage: tether-custodian %s SUBCOMMAND [--help]\n\n%s", group, usage)
		if len(args) > 0 {
			return exitOK
		}
		return exitUsage
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tether-custodian %s: unknown subcommand %q\n", group, args[0])
		return exitUsage
	}
	return f(args[1:], stdout, stderr)
}

// parse parses fs's flags; it prints the usage for --help (exit 0) and
// for errors (exit 2). ok is false when the caller should return code.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return exitOK, false
		}
		return exitUsage, false
	}
	return 0, true
}

func usageFor(fs *flag.FlagSet, synopsis, text string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tether-custodian %s\n\n%s\n\nflags:\n", synopsis, text)
		fs.PrintDefaults()
	}
}

func fail(stderr io.Writer, code int, format string, args ...any) int {
	fmt.Fprintf(stderr, "tether-custodian: "+format+"\n", args...)
	return code
}
