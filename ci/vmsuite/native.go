package vmsuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/vmcomputer/manifest"
)

// Suite (b): the chain with its receiver in a VM (ci/nativesuite).
const (
	NativeSuite = "native-client"
	// NativePackage holds the suite's tests, behind NativeTags.
	NativePackage = "./ci/nativesuite"
	NativeTags    = "vmsuite"
	// NativeTimeout bounds the suite's test binary.
	NativeTimeout = 15 * time.Minute
)

// nativeSubtests are the subtests of TestNativePipeline (fixtures/e2e's
// RunPipeline) the suite declares it must execute: a subtest renamed or
// dropped there fails the suite until it is declared again here.
var nativeSubtests = []string{"five_tools", "retry_answers_from_receipt", "child_confined", "verified_exec_receipt", "rejected_first_admission", "tuple_substitution",
	"foreign_and_operator_refused", "receiver_without_kill", "reduced_worker", "reconnect", "lease_renewal",
	"exact_cancellation", "setsid_escapee_contained", "expired_grant_fences", "unbound_session_keeps_its_backend"}

// chainBinaries are built once and used by the suite through $TETHER_BIN.
var chainBinaries = []string{bins.Receiver, bins.HostAgent, bins.Plugin, bins.Custodian}

// native is one run of suite (b).
type native struct {
	h    *Host
	r    *receipt.Receipt
	work string
	bin  string // the chain binaries' directory
	test TestBinary
}

// RunNative runs suite (b) and writes its receipt: the suite's test
// binary runs on the host (custodian, host agent, plugin), each computer
// it makes boots a guest with the receiver, and every boot appends what
// it ran to a manifest the receipt is built from.
func RunNative(ctx context.Context, h *Host) (*receipt.Receipt, error) {
	s := &native{h: h, r: h.NewReceipt(NativeSuite)}
	if err := s.run(ctx); err != nil {
		s.r.Problems = append(s.r.Problems, err.Error())
	}
	return s.r, h.Finish(s.r)
}

func (s *native) run(ctx context.Context) error {
	if !s.h.Ready() {
		return nil
	}
	work, err := s.h.suiteWork(NativeSuite)
	if err != nil {
		return err
	}
	s.work, s.bin = work, filepath.Join(work, "bin")
	fmt.Fprintf(s.h.Opts.Log, "vm-receipts: %s: building\n", NativeSuite)
	if err := s.build(ctx); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	fmt.Fprintf(s.h.Opts.Log, "vm-receipts: %s: running %d declared tests, one VM per computer\n", NativeSuite, len(s.r.Declared))
	raw, exit, err := s.runTests(ctx)
	if err != nil {
		return err
	}
	if err := s.collect(ctx, raw, exit); err != nil {
		return err
	}
	return s.readManifest()
}

// build compiles the chain's binaries and the suite's test binary, and
// declares the tests.
func (s *native) build(ctx context.Context) error {
	if err := os.MkdirAll(s.bin, 0o755); err != nil {
		return err
	}
	b := Builder{Dir: s.h.Opts.Dir, Out: s.bin}
	for _, name := range chainBinaries {
		if err := b.Build(ctx, bins.Packages[name], filepath.Join(s.bin, name)); err != nil {
			return err
		}
	}
	tb, err := Builder{Dir: s.h.Opts.Dir, Out: s.work, Tags: NativeTags}.BuildTests(ctx, []string{Module + "/ci/nativesuite"})
	if err != nil {
		return err
	}
	s.test = tb[0]
	for _, name := range s.test.Tests {
		s.r.Declared = append(s.r.Declared, s.test.Rel+" "+name)
	}
	for _, sub := range nativeSubtests {
		s.r.Declared = append(s.r.Declared, s.test.Rel+" TestNativePipeline/"+sub)
	}
	return nil
}

// runTests runs the test binary on the host, with the root and QEMU
// requirements demanded, and returns its raw test2json output.
func (s *native) runTests(ctx context.Context) ([]byte, *guestrun.Exit, error) {
	ctx, cancel := context.WithTimeout(ctx, NativeTimeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, s.test.Path, "-test.v=test2json", "-test.count=1", "-test.paniconexit0",
		"-test.timeout="+(NativeTimeout-30*time.Second).String())
	cmd.Dir = filepath.Join(s.h.Opts.Dir, s.test.Rel)
	cmd.Env = append(os.Environ(), "TETHER_TEST_REQUIRE=root,qemu", bins.EnvDir+"="+s.bin,
		manifest.EnvAccel+"="+s.h.Accel.Name, manifest.EnvKernel+"="+s.h.Kernel.Dir,
		manifest.EnvManifest+"="+s.manifest())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cmd.ProcessState == nil {
		return nil, nil, fmt.Errorf("run %s: %w", filepath.Base(s.test.Path), err)
	}
	exit := &guestrun.Exit{Code: cmd.ProcessState.ExitCode(), ElapsedS: time.Since(start).Seconds()}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		exit.TimedOut = true
	}
	if err := os.WriteFile(filepath.Join(s.work, "tests.out"), out.Bytes(), 0o644); err != nil {
		return nil, nil, err
	}
	return out.Bytes(), exit, nil
}

func (s *native) manifest() string { return filepath.Join(s.work, "manifest.jsonl") }

// collect converts the output into the receipt's tests and adds the host
// binaries.
func (s *native) collect(ctx context.Context, raw []byte, exit *guestrun.Exit) error {
	evs, err := Convert(ctx, s.test.Package, raw)
	if err != nil {
		return err
	}
	st := TestsOf(s.test.Rel, evs, exit, s.test.Tests)
	s.r.Tests = append(s.r.Tests, st.Tests...)
	s.r.Problems = append(s.r.Problems, st.Problems...)
	host := append([]string{s.test.Path}, chainPaths(s.bin)...)
	for _, p := range host {
		sum, size, err := FileSHA256(p)
		if err != nil {
			return err
		}
		s.r.Binaries = append(s.r.Binaries, receipt.Binary{Path: "host:" + filepath.Base(p), Size: size, SHA256: sum})
	}
	return nil
}

func chainPaths(dir string) []string {
	var out []string
	for _, n := range chainBinaries {
		out = append(out, filepath.Join(dir, n))
	}
	return out
}

// readManifest adds what the guests ran: the kernel release each
// reported (all must agree) and every binary of their images.
func (s *native) readManifest() error {
	ms, err := manifest.Read(s.manifest())
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("no VM computer booted: the suite never reached a guest")
	}
	if err != nil {
		return err
	}
	seen := map[receipt.Binary]bool{}
	releases := map[string]bool{}
	for _, m := range ms {
		releases[m.Release] = true
		if m.Accelerator != s.h.Accel.Name {
			s.r.Problems = append(s.r.Problems, fmt.Sprintf("a guest ran under %s, not the suite's %s", m.Accelerator, s.h.Accel.Name))
		}
		for _, e := range m.Binaries {
			seen[receipt.Binary{Path: e.Path, Size: e.Size, SHA256: e.SHA256}] = true
		}
	}
	for r := range releases {
		s.r.Kernel.Release = r
	}
	if len(releases) != 1 {
		s.r.Kernel.Release = ""
		return fmt.Errorf("the guests reported %d different kernel releases over %d boots", len(releases), len(ms))
	}
	var img []receipt.Binary
	for b := range seen {
		img = append(img, b)
	}
	sort.Slice(img, func(i, j int) bool {
		return img[i].Path < img[j].Path || (img[i].Path == img[j].Path && img[i].SHA256 < img[j].SHA256)
	})
	s.r.Binaries = append(img, s.r.Binaries...)
	fmt.Fprintf(s.h.Opts.Log, "vm-receipts: %s: %d guests booted\n", NativeSuite, len(ms))
	return nil
}
