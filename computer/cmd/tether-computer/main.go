// Command tether-computer talks to the computer service: create, ls,
// show, rm, renew, suspend and resume computers, and token add for the
// daemon's token file. Run it with --help, or any subcommand with
// --help. docs/operations.md ("Computer service API") is its reference.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
