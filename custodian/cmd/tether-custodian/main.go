// Command tether-custodian runs an ACP agent whose file and terminal
// callbacks go to one isolated computer, and inspects what it recorded:
// run, receipts show, routine save/show/run, audit verify, audit keygen.
// Run it with --help, or any subcommand with --help. docs/custodian.md is
// its reference.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tetherdev/tether/custodian/jail"
)

func main() {
	jail.HelperMain() // the jail's init or shell stub, inside a jail; returns otherwise
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
