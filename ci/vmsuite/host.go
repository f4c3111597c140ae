// Package vmsuite runs tether's CI VM suites and writes their receipts:
// suite (a), receiver isolation, runs the receiver packages' tests as root
// inside a QEMU guest; suite (b), native client computer, runs the chain's
// host side against a receiver inside a guest (ci/nativesuite). Each
// suite leaves ci/receipts/<suite>.json (package ci/receipt), and a suite
// that cannot build, boot or finish still leaves a receipt, a failing one.
package vmsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/fixtures/guest"
)

// DefaultKernelDir is the kernel the suites boot unless told otherwise:
// $TETHER_CACHE/kernel/vmsuite, a Debian kernel whose Landlock ABI is at
// least the receiver's (ci/vmkernel unpacks it).
func DefaultKernelDir() string { return guest.KernelDir(guest.KernelVMSuite) }

// Options configure a run of the suites.
type Options struct {
	Dir       string    // module root (the source built and hashed)
	Work      string    // scratch: binaries, images, reports, console logs
	Out       string    // receipts directory
	KernelDir string    // "" means DefaultKernelDir()
	QEMU      string    // "" means qemu-system-x86_64
	Accel     string    // AccelAuto, AccelTCG or AccelKVM; "" means auto
	CPUs      int       // guest vCPUs; 0 means 2
	MemoryMiB int       // guest memory; 0 means 2048
	Append    []string  // extra guest kernel command-line words (debugging; tests inject failures)
	Mutation  string    // suite (a) only: a Mutations name, "" for none
	Packages  string    // suite (a) only, for tests: a narrower package pattern; the suite is then named IsolationSuite+"-subset"
	Log       io.Writer // progress for a person; nil discards
}

func (o *Options) defaults() {
	if o.KernelDir == "" {
		o.KernelDir = DefaultKernelDir()
	}
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	if o.Accel == "" {
		o.Accel = AccelAuto
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 2048
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	for _, p := range []*string{&o.Dir, &o.Work, &o.Out, &o.KernelDir} {
		if abs, err := filepath.Abs(*p); err == nil { // binaries run in package directories
			*p = abs
		}
	}
}

// Host is what every suite of one run shares: the options, the kernel,
// the accelerator and the provenance that goes into each receipt. Its
// setup problems (no kernel, no QEMU, no git) become problems of every
// receipt, so a broken machine yields failing receipts, not missing ones.
type Host struct {
	Opts     Options
	Kernel   guest.Kernel
	Accel    guest.Accel
	Go       string
	QEMU     string
	Source   receipt.Source
	Vmlinux  string // hex SHA-256 of the kernel image
	Problems []string
}

// NewHost gathers provenance and chooses the accelerator. It never fails:
// whatever it cannot establish is recorded in Problems.
func NewHost(ctx context.Context, opts Options) *Host {
	opts.defaults()
	h := &Host{Opts: opts}
	note := func(err error) {
		if err != nil {
			h.Problems = append(h.Problems, err.Error())
		}
	}
	var err error
	if h.Source, err = SourceTree(ctx, opts.Dir); err != nil {
		note(err)
	}
	if h.Go, err = GoVersion(ctx); err != nil {
		note(err)
	}
	if h.QEMU, err = QEMUVersion(ctx, opts.QEMU); err != nil {
		note(err)
	}
	if h.Kernel, err = guest.KernelAt(opts.KernelDir); err != nil {
		note(fmt.Errorf("guest kernel %s: %w (ci/vmkernel unpacks it)", opts.KernelDir, err))
		return h
	}
	if h.Vmlinux, _, err = FileSHA256(h.Kernel.Vmlinux); err != nil {
		note(err)
	}
	if err := os.MkdirAll(opts.Work, 0o755); err != nil {
		note(err)
		return h
	}
	h.Accel, err = guest.ChooseAccel(ctx, opts.Accel, h.Kernel, opts.QEMU, opts.Work)
	note(err)
	fmt.Fprintf(opts.Log, "vm-receipts: accelerator %s (%s)\n", h.Accel.Name, h.Accel.Reason)
	return h
}

// Ready reports whether the host can boot a suite at all.
func (h *Host) Ready() bool { return len(h.Problems) == 0 }

// NewReceipt starts the receipt of suite with the host's provenance.
func (h *Host) NewReceipt(suite string) *receipt.Receipt {
	return &receipt.Receipt{
		Suite:    suite,
		Problems: append([]string{}, h.Problems...),
		Go:       h.Go,
		Kernel:   receipt.Kernel{Image: h.Kernel.Version, VmlinuxSHA256: h.Vmlinux},
		QEMU:     receipt.QEMU{Version: h.QEMU, Accelerator: h.Accel.Name, AccelReason: h.Accel.Reason},
		Source:   h.Source,
		Started:  time.Now().UTC(),
	}
}

// Finish stamps the end time and writes r to the receipts directory.
func (h *Host) Finish(r *receipt.Receipt) error {
	r.Ended = time.Now().UTC()
	if err := receipt.Write(h.Opts.Out, r); err != nil {
		return fmt.Errorf("write receipt %s: %w", r.Suite, err)
	}
	fmt.Fprintln(h.Opts.Log, r.Summary)
	return nil
}

// suiteWork returns (and creates) the scratch directory of one suite.
func (h *Host) suiteWork(suite string) (string, error) {
	dir := filepath.Join(h.Opts.Work, suite)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// lookPath is exec.LookPath with the failure named.
func lookPath(name, hint string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", errors.Join(fmt.Errorf("%s not found (%s)", name, hint), err)
	}
	return p, nil
}
