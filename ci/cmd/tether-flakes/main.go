// Command tether-flakes is the flake hunt: it runs tether's tests many
// times (go test -count, in one or more fresh rounds, with -race by
// default) and optionally the VM suites (ci/vm-receipts) several times,
// optionally beside busy loops (-hog) or without cgo (-cgo=0), then
// writes a JSON report of every test's failure count and prints a short
// summary. ci/flakes runs it; docs/ci.md explains it. It is a tool
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
	o, sum, goal, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "tether-flakes: %v\n", err)
		}
		return exitUsage
	}
	o.Log = stderr
	if sum != "" {
		return sumLedger(ctx, o.Dir, sum, goal, stdout, stderr)
	}
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

// sumLedger prints the ledger's sum and exits clean only if it meets the goal.
func sumLedger(ctx context.Context, dir, ledger string, goal int, stdout, stderr io.Writer) int {
	l, err := flakehunt.Sum(ctx, dir, ledger, goal)
	if err != nil {
		fmt.Fprintf(stderr, "tether-flakes: %v\n", err)
		return exitUsage
	}
	l.Print(stdout)
	if !l.Met() {
		return exitFailures
	}
	return exitClean
}

// parse reads the flags: the hunt's options, or a ledger to sum (-sum)
// with its goal.
func parse(args []string, stderr io.Writer) (o flakehunt.Options, sum string, goal int, err error) {
	fs := flag.NewFlagSet("tether-flakes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var vmArgs, inputs string
	fs.StringVar(&o.Ledger, "ledger", "", "file the report in this ledger directory (inside the module, committed; docs/ci.md)")
	fs.StringVar(&sum, "sum", "", "add up this ledger's entries made on HEAD's tree and check them against -goal; runs nothing")
	fs.IntVar(&goal, "goal", 20, "with -sum: runs every test, and runs of the VM suites, must reach")
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
	fs.IntVar(&o.Hog, "hog", 0, "busy loops (threads spinning on the CPU) run beside the go test rounds and VM runs, as a loaded machine")
	fs.StringVar(&o.Cgo, "cgo", "", "CGO_ENABLED of the go test rounds, 0 or 1 (default: the environment's); -cgo=0 needs -race=false")
	fs.StringVar(&inputs, "read", "", "comma-separated go test -json files of earlier runs to count too (use with -rounds 0 to only count them)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ci/flakes [flags] [packages]   (default packages: ./...)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, "", 0, err
	}
	o.Packages, o.VMArgs = fs.Args(), strings.Fields(vmArgs)
	if inputs != "" {
		o.Inputs = strings.Split(inputs, ",")
	}
	if sum != "" && goal < 1 {
		return o, "", 0, fmt.Errorf("-goal %d must be at least 1", goal)
	}
	o.Dir, err = os.Getwd()
	return o, sum, goal, err
}
