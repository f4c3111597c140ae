// Command tether-plugin is the go-plugin binary a host agent loads with
// plugin/host.Load. Run by hand it explains itself and exits non-zero;
// asked for --help by hand it prints its usage on stdout and exits 0.
package main

import (
	"context"
	"os"

	"github.com/tetherdev/tether/plugin/server"
)

func main() {
	os.Exit(run(context.Background()))
}

func run(ctx context.Context) int {
	return server.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, server.Config{})
}
