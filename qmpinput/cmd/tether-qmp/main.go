// Command tether-qmp drives the visual-only QMP adapter: capture a
// screenshot, run a script of pointer and keyboard actions, and verify a
// signed VM bundle before a launch. Every subcommand has --help.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
