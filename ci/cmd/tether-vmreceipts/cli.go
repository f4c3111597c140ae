package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/ci/vmsuite"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // a suite failed or a receipt was refused
	exitUsage  = 2
)

const usage = `usage:
  tether-vmreceipts run [flags]               run the VM suites and write their receipts
  tether-vmreceipts check [flags] [SUITE...]  check receipts (default: every suite)

Suites: %s
A receipt is refused if it is missing, shows a failed or skipped test or a
problem, or shows fewer executed tests than its suite declares.
`

// suites maps each suite to its runner, in run order.
var suites = []struct {
	name string
	run  func(context.Context, *vmsuite.Host) (*receipt.Receipt, error)
}{
	{vmsuite.IsolationSuite, vmsuite.RunIsolation},
	{vmsuite.NativeSuite, vmsuite.RunNative},
}

func suiteNames() []string {
	var out []string
	for _, s := range suites {
		out = append(out, s.name)
	}
	return out
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, strings.Join(suiteNames(), ", "))
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runSuites(ctx, args[1:], stdout, stderr)
	case "check":
		return check(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, usage, strings.Join(suiteNames(), ", "))
		return exitOK
	}
	fmt.Fprintf(stderr, usage, strings.Join(suiteNames(), ", "))
	return exitUsage
}

func runSuites(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tether-vmreceipts run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o vmsuite.Options
	fs.StringVar(&o.Dir, "src", ".", "module root to build and hash")
	fs.StringVar(&o.Out, "out", "ci/receipts", "receipts `directory`")
	fs.StringVar(&o.Work, "work", ".cache/vm-receipts", "scratch `directory` (binaries, images, console logs)")
	fs.StringVar(&o.KernelDir, "kernel", "", "guest kernel `directory` (default "+vmsuite.DefaultKernelDir()+")")
	fs.StringVar(&o.Accel, "accel", vmsuite.AccelAuto, "accelerator: auto (probe KVM, else TCG), tcg or kvm")
	fs.IntVar(&o.CPUs, "cpus", 2, "guest vCPUs")
	fs.IntVar(&o.MemoryMiB, "memory", 2048, "guest memory in MiB")
	fs.StringVar(&o.Mutation, "mutate", "", "build suite (a) with a deliberate breakage `NAME` (to show the suite fails): "+mutationNames())
	only := fs.String("suite", "", "run only this `suite`")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tether-vmreceipts run [flags]\n\nRuns the VM suites and writes <out>/<suite>.json for each; exits 1 if any receipt is refused.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return helpOrUsage(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return exitUsage
	}
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailed
	}
	o.Dir, o.Log = abs, stdout
	if o.Mutation != "" {
		if _, err := vmsuite.FindMutation(o.Mutation); err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
		if *only == "" {
			*only = vmsuite.IsolationSuite
		}
	}
	return runSelected(ctx, o, *only, stdout, stderr)
}

func runSelected(ctx context.Context, o vmsuite.Options, only string, stdout, stderr io.Writer) int {
	if only != "" && !known(only) {
		fmt.Fprintf(stderr, "unknown suite %q (known: %s)\n", only, strings.Join(suiteNames(), ", "))
		return exitUsage
	}
	code := exitOK
	h := vmsuite.NewHost(ctx, o)
	var ran []string
	for _, s := range suites {
		if only != "" && s.name != only {
			continue
		}
		name := s.name
		if name == vmsuite.IsolationSuite {
			name = vmsuite.IsolationName(o) // a subset or a mutated run has a receipt of its own
		}
		ran = append(ran, name)
		if err := removeStale(o.Out, name); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			code = exitFailed
			continue
		}
		if _, err := s.run(ctx, h); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", s.name, err)
			code = exitFailed
		}
	}
	fmt.Fprintln(stdout, "vm-receipts: checking the receipts written to", o.Out)
	if c := checkAll(o.Out, ran, stdout); c != exitOK {
		code = c
	}
	return code
}

// removeStale deletes a suite's receipt from an earlier run before the
// suite runs, so the gate can only ever read what this run wrote: a suite
// that writes none fails as missing, never passes on yesterday's receipt.
func removeStale(dir, suite string) error {
	err := os.Remove(receipt.Path(dir, suite))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the receipt of an earlier run: %w", err)
	}
	return nil
}

// checkAll reads each suite's receipt back from dir and checks it: this
// is the gate, so a receipt that was never written fails it.
func checkAll(dir string, names []string, stdout io.Writer) int {
	code := exitOK
	for _, name := range names {
		r, err := receipt.CheckFile(dir, name)
		if r != nil {
			fmt.Fprintln(stdout, r.Summarize())
		}
		if err != nil {
			printReasons(stdout, err)
			printFailures(stdout, r)
			code = exitFailed
		}
	}
	return code
}

// printFailures prints the output each failed test's receipt kept (its
// tail), so that a refused run in CI shows why without the receipt file.
func printFailures(w io.Writer, r *receipt.Receipt) {
	if r == nil {
		return
	}
	for _, t := range r.Tests {
		if t.Result != receipt.Fail || t.Output == "" {
			continue
		}
		fmt.Fprintf(w, "--- %s %s: the output its receipt kept\n", t.Package, t.Name)
		for _, line := range strings.Split(strings.TrimRight(t.Output, "\n"), "\n") {
			fmt.Fprintf(w, "    %s\n", line)
		}
	}
}

func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tether-vmreceipts check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "ci/receipts", "receipts `directory`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: tether-vmreceipts check [--dir DIR] [SUITE...]\n\nChecks <dir>/<suite>.json for each suite (default: %s) and exits 1 if any is\nmissing, shows a failure, a skip or a problem, or fewer executed tests than declared.\n",
			strings.Join(suiteNames(), ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return helpOrUsage(err)
	}
	names := fs.Args()
	if len(names) == 0 {
		names = suiteNames()
	}
	return checkAll(*dir, names, stdout)
}

func printReasons(w io.Writer, err error) {
	var re *receipt.RejectError
	if !errors.As(err, &re) {
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintf(w, "%s: REFUSED\n", re.Suite)
	for _, why := range re.Reasons {
		fmt.Fprintf(w, "  - %s\n", why)
	}
}

func known(name string) bool {
	for _, s := range suiteNames() {
		if s == name {
			return true
		}
	}
	return false
}

func mutationNames() string {
	var out []string
	for _, m := range vmsuite.Mutations {
		out = append(out, m.Name)
	}
	return strings.Join(out, ", ")
}

func helpOrUsage(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}
