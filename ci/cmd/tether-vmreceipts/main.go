// Command tether-vmreceipts runs tether's CI VM suites, writes their
// receipts and checks them (docs/ci.md).
//
//	tether-vmreceipts run [flags]          run the suites, write ci/receipts/<suite>.json
//	tether-vmreceipts check [flags] [SUITE...]  refuse a missing, failing, skipping or short receipt
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
