package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	cliconv "github.com/tetherdev/tether/admission/cli"
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
  tether-custodian run --config FILE|--computer-socket SOCK [--agent PROFILE] [--session-id ID] [--prompt TEXT]... -- AGENT_CMD [ARGS...]
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
		return cliconv.UsageError(stderr, "tether-custodian", "no command given")
	}
	if cliconv.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	switch cmd, rest := args[0], args[1:]; cmd {
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
		return cliconv.UsageError(stderr, "tether-custodian", "unknown command %q", cmd)
	}
}

func sub(args []string, stdout, stderr io.Writer, group string, cmds map[string]func([]string, io.Writer, io.Writer) int) int {
	prog := "tether-custodian " + group
	if len(args) == 0 {
		return cliconv.UsageError(stderr, prog, "no subcommand given")
	}
	if cliconv.IsHelp(args[0]) {
		groupUsage(stdout, prog)
		return exitOK
	}
	f, ok := cmds[args[0]]
	if !ok {
		return cliconv.UsageError(stderr, prog, "unknown subcommand %q", args[0])
	}
	return f(args[1:], stdout, stderr)
}

// groupUsage prints the synopsis of a group's subcommands, the lines of
// usage that start with prog.
func groupUsage(w io.Writer, prog string) {
	fmt.Fprintf(w, "usage: %s SUBCOMMAND [--help]\n\n", prog)
	for _, l := range strings.Split(usage, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prog+" ") {
			fmt.Fprintln(w, l)
		}
	}
}

// parse parses fs's flags (admission/cli: --help prints the usage on
// stdout, exit 0; a flag error prints a hint on stderr, exit 2). ok is
// false when the caller should return code.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	code, done := cliconv.Parse(fs, args, stdout, stderr)
	return code, !done
}

// usageFor names fs "tether-custodian NAME" and sets its usage.
func usageFor(fs *flag.FlagSet, synopsis, text string) {
	cliconv.SetUsage(fs, "tether-custodian "+fs.Name(), "tether-custodian "+synopsis, text)
}

func fail(stderr io.Writer, code int, format string, args ...any) int {
	fmt.Fprintf(stderr, "tether-custodian: "+format+"\n", args...)
	return code
}
