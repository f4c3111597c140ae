// Command tether-flakes is the flake hunt: it runs tether's tests many
// times (go test -count, in one or more fresh rounds, with -race by
// default) and optionally the VM suites (ci/vm-receipts) several times,
// then writes a JSON report of every test's failure count and prints a
// short summary. ci/flakes runs it; docs/ci.md explains it. It is a tool
// for engineers and release checks, never part of .ci/run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tetherdev/tether/ci/flakehunt"
)

// Exit codes.
const (
	exitClean    = 0 // nothing failed
	exitFailures = 1 // a test, a package or a VM run failed at least once
	exitUsage    = 2 // bad flags, or the hunt itself could not run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "tether-flakes: %v\n", err)
		}
		return exitUsage
	}
	o.Log = stderr
	r, err := flakehunt.Run(ctx, o)
	if r != nil {
		r.Print(stdout)
		fmt.Fprintf(stdout, "report: %s\n", filepath.Join(o.Out, flakehunt.ReportName))
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "tether-flakes: %v\n", err)
		return exitUsage
	case !r.Clean():
		return exitFailures
	}
	return exitClean
}

func parse(args []string, stderr io.Writer) (flakehunt.Options, error) {
	fs := flag.NewFlagSet("tether-flakes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o flakehunt.Options
	var vmArgs, inputs string
	fs.IntVar(&o.Count, "count", 20, "runs of every test per round (go test -count)")
	fs.IntVar(&o.Rounds, "rounds", 1, "separate go test invocations (fresh test processes); 0 runs only the VM suites")
	fs.BoolVar(&o.Race, "race", true, "build with the race detector")
	fs.StringVar(&o.Run, "run", "", "only tests matching this regexp (go test -run)")
	fs.IntVar(&o.Parallel, "p", 0, "packages tested in parallel (go test -p; 0: the go command's default)")
	fs.StringVar(&o.Shuffle, "shuffle", "", "go test -shuffle (on, off or a seed)")
	fs.DurationVar(&o.Timeout, "timeout", 0, "go test -timeout of each round (0: 30m times -count)")
	fs.StringVar(&o.Out, "out", ".cache/flakes", "directory for the report, raw test output and VM receipts")
	fs.IntVar(&o.VMRuns, "vm", 0, "runs of ci/vm-receipts after the go test rounds (as root, after ci/setup)")
	fs.StringVar(&vmArgs, "vm-args", "", "arguments for ci/vm-receipts, e.g. \"--suite native-client --accel tcg\"")
	fs.StringVar(&inputs, "read", "", "comma-separated go test -json files of earlier runs to count too (use with -rounds 0 to only count them)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ci/flakes [flags] [packages]   (default packages: ./...)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.Packages, o.VMArgs = fs.Args(), strings.Fields(vmArgs)
	if inputs != "" {
		o.Inputs = strings.Split(inputs, ",")
	}
	dir, err := os.Getwd()
	if err != nil {
		return o, err
	}
	o.Dir = dir
	return o, nil
}
