package vmsuite

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/ci/receipt"
	"github.com/tetherdev/tether/fixtures/guest"
)

// Suite (a): every test of the receiver packages, run as root in the guest.
const (
	IsolationSuite = "receiver-isolation"
	// IsolationPackages is the pattern of the packages whose tests run.
	IsolationPackages = "./receiver/..."
	// StepTimeout bounds one test binary in the guest.
	StepTimeout = 5 * time.Minute
	// IsolationTimeout bounds the whole boot.
	IsolationTimeout = 12 * time.Minute
)

// notInGuest lists the tests of the suite's packages that cannot run in
// its guest, by module-relative package and name, with the reason. They
// are not declared, are skipped with -test.skip, and are listed in the
// receipt's "excluded"; make test runs them on the host.
var notInGuest = map[string]map[string]string{
	"receiver/conformance": {
		"TestIntegrationVirtioSerial": "boots its own QEMU guest; the suite's guest has no QEMU (no nested VM under TCG)",
	},
	"receiver/spawn": {
		"TestCgroupV1Join": "needs cgroup v1 pids and memory hierarchies (a hybrid host); the guest mounts cgroup2 only",
		"TestSeccompDeniesAttacks": "its probe is a python3 script; the guest has no python3 (the filter's masks, cgroup placement, " +
			"parent-death and no-leak tests run in the guest)",
		"TestSeccompDeniesUnshareTool": "runs util-linux unshare and coreutils id, which the guest does not have",
		"TestSeccompWorkday":           "runs cc, python3, node and git, which the guest does not have",
		"TestSecurityMDListsEveryRule": "reads SECURITY.md from the source tree, which the guest does not have",
	},
	"receiver": {
		"TestIntegrationCgroupV1Limits": "needs cgroup v1 pids and memory hierarchies (a hybrid host); the guest mounts cgroup2 only",
	},
}

// hostPrograms are the host's own programs placed in the guest (with their
// libraries) where busybox would behave differently: /bin/sh is Debian's
// dash (busybox ash exports SHLVL, which the receiver's exact-environment
// tests would see), capsh runs /bin/bash.
var hostPrograms = []struct{ name, hint string }{
	{"/bin/sh", "dash"},
	{"/bin/bash", "bash"},
	{"capsh", "ci/setup installs libcap2-bin"},
}

// guestModules are the modules the suite's guest loads: the report port
// and AF_VSOCK (for the vsock transport's listen test).
var guestModules = append([]string{"vsock"}, guest.ModulesVirtioSerial...)

// guestEnv is the whole environment of a test binary in the guest (plus
// the prebuilt variables below). The root and cgroup2 requirements are
// demanded, so a test that would skip for want of them fails instead. The guest has no Go
// toolchain: nothing is compiled there.
var guestEnv = []string{
	"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "TMPDIR=/tmp", "GOTRACEBACK=all",
	"TETHER_TEST_REQUIRE=root,cgroup2",
}

// prebuiltEnv maps a main package whose tests run its own binary to the
// variable those tests read it from (their explicit hook, instead of
// running go build). The host builds the binary with the suite's flags,
// places it in the image and sets the variable for every step.
var prebuiltEnv = map[string]string{
	"receiver/cmd/tether-receiver": "TETHER_TEST_RECEIVER_BIN",
}

// isolation is one run of suite (a).
type isolation struct {
	h        *Host
	r        *receipt.Receipt
	work     string
	mutation *Mutation
	packages string
	bins     []TestBinary
	files    []guest.File
	env      []string // prebuiltEnv settings for the binaries in the image
}

// IsolationName is the name of suite (a)'s receipt for o: IsolationSuite,
// with "-subset" when o names other packages and "+" and the mutation's
// name when o names one.
func IsolationName(o Options) string {
	name := IsolationSuite
	if o.Packages != "" {
		name += "-subset"
	}
	if o.Mutation != "" {
		name += "+" + o.Mutation
	}
	return name
}

// RunIsolation runs suite (a) and writes its receipt. With a mutation the
// suite is named IsolationSuite+"+"+mutation and can never pass.
func RunIsolation(ctx context.Context, h *Host) (*receipt.Receipt, error) {
	s := &isolation{h: h, packages: IsolationPackages}
	if h.Opts.Packages != "" {
		s.packages = h.Opts.Packages
	}
	if h.Opts.Mutation != "" {
		m, err := FindMutation(h.Opts.Mutation)
		if err != nil {
			return nil, err
		}
		s.mutation = &m
	}
	s.r = h.NewReceipt(IsolationName(h.Opts))
	if s.mutation != nil {
		s.problem("built with the deliberate breakage %q (%s); this receipt can never pass", s.mutation.Name, s.mutation.Doc)
	}
	if err := s.run(ctx); err != nil {
		s.problem("%v", err)
	}
	return s.r, h.Finish(s.r)
}

func (s *isolation) problem(format string, args ...any) {
	s.r.Problems = append(s.r.Problems, fmt.Sprintf(format, args...))
}

func (s *isolation) run(ctx context.Context) error {
	if !s.h.Ready() {
		return nil // the host's problems are already in the receipt
	}
	work, err := s.h.suiteWork(s.r.Suite)
	if err != nil {
		return err
	}
	s.work = work
	fmt.Fprintf(s.h.Opts.Log, "vm-receipts: %s: building\n", s.r.Suite)
	img, err := s.buildImage(ctx)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	fmt.Fprintf(s.h.Opts.Log, "vm-receipts: %s: booting %d test binaries (%d tests declared)\n",
		s.r.Suite, len(s.bins), len(s.r.Declared))
	return s.boot(ctx, img)
}

// buildImage builds the binaries and the image, and declares the tests.
func (s *isolation) buildImage(ctx context.Context) (string, error) {
	bin := filepath.Join(s.work, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	b := Builder{Dir: s.h.Opts.Dir, Out: bin}
	if s.mutation != nil {
		ov, err := Overlay(s.h.Opts.Dir, s.work, []Mutation{*s.mutation})
		if err != nil {
			return "", err
		}
		b.Overlay = ov
	}
	pkgs, err := b.TestPackages(ctx, s.packages)
	if err != nil {
		return "", err
	}
	if s.bins, err = b.BuildTests(ctx, pkgs); err != nil {
		return "", err
	}
	mains, err := b.MainPackages(ctx, pkgs...)
	if err != nil {
		return "", err
	}
	if err := s.addFiles(ctx, b, mains); err != nil {
		return "", err
	}
	initBin := filepath.Join(s.work, "tether-suiteinit")
	if err := (Builder{Dir: s.h.Opts.Dir}).Build(ctx, "./ci/cmd/tether-suiteinit", initBin); err != nil {
		return "", err
	}
	img, binaries, err := BuildImage(ctx, ImageSpec{Kernel: s.h.Kernel, Init: initBin, Plan: s.plan(),
		Files: s.files, Modules: guestModules}, filepath.Join(s.work, "initramfs.cpio"))
	if err != nil {
		return "", err
	}
	s.r.Binaries = binaries
	return img.Path, nil
}

// addFiles places the test binaries, their testdata, the prebuilt main
// binaries of prebuiltEnv (and sets their variables), and the host
// programs with their libraries.
func (s *isolation) addFiles(ctx context.Context, b Builder, mains map[string]bool) error {
	for i := range s.bins {
		tb := &s.bins[i]
		dir := path.Join(SrcDir, tb.Rel)
		s.files = append(s.files, guest.File{Path: path.Join(BinDir, filepath.Base(tb.Path)), Source: tb.Path, Mode: 0o755})
		td, err := TestdataFiles(filepath.Join(s.h.Opts.Dir, tb.Rel), dir)
		if err != nil {
			return err
		}
		s.files = append(s.files, td...)
		s.exclude(&s.bins[i])
		for _, name := range tb.Tests {
			s.r.Declared = append(s.r.Declared, tb.Rel+" "+name)
		}
		env, ok := prebuiltEnv[tb.Rel]
		if !ok || !mains[tb.Package] {
			continue
		}
		out := filepath.Join(b.Out, path.Base(tb.Rel))
		if err := b.Build(ctx, tb.Package, out); err != nil {
			return err
		}
		guestBin := path.Join(BinDir, path.Base(tb.Rel))
		s.files = append(s.files, guest.File{Path: guestBin, Source: out, Mode: 0o755})
		s.env = append(s.env, env+"="+guestBin)
	}
	for _, hp := range hostPrograms {
		p, err := lookPath(hp.name, hp.hint)
		if err != nil {
			return err
		}
		files, err := HostProgram(p)
		if err != nil {
			return err
		}
		s.files = append(s.files, files...)
	}
	s.files = append(s.files, guest.File{Path: "/etc/hostname", Data: []byte(guestrun.Hostname + "\n")})
	return nil
}

// exclude drops the tests of tb that cannot run in the guest from its
// declared tests and records them in the receipt.
func (s *isolation) exclude(tb *TestBinary) {
	var kept, skip []string
	for _, name := range tb.Tests {
		if why, ok := notInGuest[tb.Rel][name]; ok {
			s.r.Excluded = append(s.r.Excluded, receipt.Excluded{Package: tb.Rel, Name: name, Reason: why})
			skip = append(skip, regexp.QuoteMeta(name))
			continue
		}
		kept = append(kept, name)
	}
	tb.Tests = kept
	if len(skip) > 0 {
		tb.Skip = "^(" + strings.Join(skip, "|") + ")$"
	}
}

func (s *isolation) plan() guestrun.Plan {
	p := guestrun.Plan{Suite: s.r.Suite, Port: Port, Env: append(slices.Clone(guestEnv), s.env...)}
	for _, tb := range s.bins {
		argv := []string{path.Join(BinDir, filepath.Base(tb.Path)), "-test.v=test2json", "-test.count=1",
			"-test.paniconexit0", "-test.timeout=" + (StepTimeout - 30*time.Second).String()}
		if tb.Skip != "" {
			argv = append(argv, "-test.skip="+tb.Skip)
		}
		p.Steps = append(p.Steps, guestrun.Step{
			Name:     tb.Rel,
			Argv:     argv,
			Dir:      path.Join(SrcDir, tb.Rel),
			TimeoutS: int(StepTimeout / time.Second),
		})
	}
	return p
}

// boot runs the image and turns the report into the receipt's tests.
func (s *isolation) boot(ctx context.Context, img string) error {
	console, err := os.Create(filepath.Join(s.work, "console.log"))
	if err != nil {
		return err
	}
	defer console.Close()
	b := BootAndCollect(ctx, BootSpec{Kernel: s.h.Kernel, Initramfs: img, QEMU: s.h.Opts.QEMU,
		Accel: s.h.Accel.Name, MemoryMiB: s.h.Opts.MemoryMiB, CPUs: s.h.Opts.CPUs,
		Report: filepath.Join(s.work, "report.jsonl"), Timeout: IsolationTimeout, Append: s.h.Opts.Append,
		ConsoleLog: progress{console, s.h.Opts.Log}}, len(s.bins))
	s.r.Problems = append(s.r.Problems, b.Problems...)
	kept, err := KeepConsole(console.Name(), s.h.Opts.Out, s.r.Suite, len(b.Problems) > 0)
	if err != nil {
		return err
	}
	if kept != "" {
		s.problem("the whole guest console is kept beside this receipt as %s", kept)
	}
	s.r.Kernel.Release = b.Transcript.Release
	for i, step := range b.Transcript.Steps {
		if !step.Started {
			s.problem("%s: never started (%d declared tests)", s.bins[i].Rel, len(s.bins[i].Tests))
			continue
		}
		raw := filepath.Join(s.work, strings.ReplaceAll(s.bins[i].Rel, "/", "_")+".out")
		if err := os.WriteFile(raw, step.Output, 0o644); err != nil {
			return err
		}
		evs, err := Convert(ctx, s.bins[i].Package, step.Output)
		if err != nil {
			s.problem("%s: %v", s.bins[i].Rel, err)
			continue
		}
		st := TestsOf(s.bins[i].Rel, evs, step.Exit, s.bins[i].Tests)
		s.r.Tests = append(s.r.Tests, st.Tests...)
		s.r.Problems = append(s.r.Problems, st.Problems...)
	}
	return nil
}
