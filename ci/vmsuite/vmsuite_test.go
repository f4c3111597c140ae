package vmsuite

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tetherdev/tether/ci/guestrun"
	"github.com/tetherdev/tether/ci/receipt"
)

// moduleRoot is the module root seen from this package's directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestTestsOf(t *testing.T) {
	evs := []event{
		{Action: "run", Test: "TestPass"},
		{Action: "output", Test: "TestPass", Output: "=== RUN   TestPass\n"},
		{Action: "pass", Test: "TestPass", Elapsed: 0.5},
		{Action: "run", Test: "TestFail"},
		{Action: "output", Test: "TestFail", Output: "    x_test.go:3: boom\n"},
		{Action: "fail", Test: "TestFail", Elapsed: 0.1},
		{Action: "run", Test: "TestSub"},
		{Action: "run", Test: "TestSub/skipped"},
		{Action: "skip", Test: "TestSub/skipped"},
		{Action: "pass", Test: "TestSub"},
		{Action: "run", Test: "TestCrash"},
		{Action: "output", Test: "TestCrash", Output: "panic: oops\n"},
		{Action: "output", Output: "FAIL\n"},
		{Action: "fail"},
	}
	exit := &guestrun.Exit{Code: 2, ElapsedS: 3}
	st := TestsOf("receiver/x", evs, exit, []string{"TestPass", "TestFail", "TestSub", "TestCrash", "TestNeverRan"})
	got := map[string]receipt.Test{}
	for _, tt := range st.Tests {
		got[tt.Name] = tt
		if tt.Package != "receiver/x" {
			t.Errorf("%s: package %q", tt.Name, tt.Package)
		}
	}
	for name, want := range map[string]receipt.Result{"TestPass": receipt.Pass, "TestFail": receipt.Fail,
		"TestSub": receipt.Pass, "TestSub/skipped": receipt.Skip, "TestCrash": receipt.Fail} {
		if got[name].Result != want {
			t.Errorf("%s: %q, want %q", name, got[name].Result, want)
		}
	}
	if got["TestPass"].Output != "" || got["TestPass"].ElapsedS != 0.5 {
		t.Errorf("a passing test keeps no output and its elapsed time: %+v", got["TestPass"])
	}
	if !strings.Contains(got["TestFail"].Output, "boom") || !strings.Contains(got["TestCrash"].Output, "never finished") {
		t.Errorf("failures keep their output: %q / %q", got["TestFail"].Output, got["TestCrash"].Output)
	}
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "1 declared tests never ran: TestNeverRan") {
		t.Errorf("problems %q", st.Problems)
	}
	c := receipt.Tally(st.Tests, []string{"a", "b", "c", "d", "e"})
	if c != (receipt.Counts{Declared: 5, Executed: 4, Ignored: 1, Failed: 2}) {
		t.Errorf("counts %+v", c)
	}
}

// A binary that fails without any failing test (TestMain exit, a panic
// outside a test, a timeout) is a problem of the suite.
func TestTestsOfBinaryFailureWithoutTest(t *testing.T) {
	evs := []event{{Action: "output", Output: "TestMain: cannot set up\n"}, {Action: "fail"}}
	st := TestsOf("receiver/x", evs, &guestrun.Exit{Code: 1}, nil)
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "exit 1") || !strings.Contains(st.Problems[0], "cannot set up") {
		t.Fatalf("problems %q", st.Problems)
	}
	st = TestsOf("receiver/x", nil, nil, nil)
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "no exit reported") {
		t.Fatalf("a step without an exit: problems %q", st.Problems)
	}
}

func TestKeepTailCutsOnRuneBoundary(t *testing.T) {
	s := strings.Repeat("€", outputTail) // 3 bytes each
	got := keepTail(s)
	if !strings.HasPrefix(got, "…€") || len(got) > outputTail+len("…") {
		t.Fatalf("keepTail: %d bytes, prefix %q", len(got), got[:6])
	}
}

// The mutations must still apply to the receiver as it is: if the
// receiver's code moved, this fails instead of the suite silently testing
// an unbroken receiver.
func TestMutationsApplyToTheReceiver(t *testing.T) {
	root := moduleRoot(t)
	for _, m := range Mutations {
		src, data, err := m.Apply(root)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		orig, _ := os.ReadFile(src)
		if string(data) == string(orig) || !strings.Contains(string(data), "deliberate breakage") {
			t.Fatalf("%s: the mutated file is unchanged", m.Name)
		}
	}
	if _, err := FindMutation("no-such"); !errors.Is(err, ErrMutation) {
		t.Fatalf("FindMutation(unknown) = %v", err)
	}
	// A receiver whose anchor is gone makes the mutation fail loudly.
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "receiver/spawn"), 0o755)
	os.WriteFile(filepath.Join(dir, "receiver/spawn/thread.go"), []byte("package spawn\n"), 0o644)
	if _, _, err := Mutations[0].Apply(dir); !errors.Is(err, ErrMutation) {
		t.Fatalf("Apply without its anchor = %v, want ErrMutation", err)
	}
	if _, err := Overlay(root, t.TempDir(), Mutations); !errors.Is(err, ErrMutation) {
		t.Fatalf("two mutations of one file = %v, want ErrMutation", err)
	}
}

func TestHostProgramBringsItsLibraries(t *testing.T) {
	files, err := HostProgram("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if files[0].Path != "/bin/sh" {
		t.Fatalf("first file %+v", files[0])
	}
	deps, err := elfDeps(files[0].Source)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		if _, err := os.Stat(f.Source); err != nil {
			t.Errorf("%s: source %s: %v", f.Path, f.Source, err)
		}
		have[f.Path] = true
	}
	for _, d := range deps {
		if !have[d] {
			t.Errorf("dependency %s of /bin/sh is not placed in the image", d)
		}
	}
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// SourceTree hashes the working tree as it is, without touching the
// repository's index or object store.
func TestSourceTree(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	os.WriteFile(filepath.Join(dir, "a.go"), []byte("package a\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("ignored\n"), 0o644)
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-qm", "one")
	ctx := context.Background()
	clean, err := SourceTree(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if clean.Dirty || clean.GitTree != git(t, dir, "rev-parse", "HEAD^{tree}") || clean.GitHead != git(t, dir, "rev-parse", "HEAD") {
		t.Fatalf("clean tree: %+v", clean)
	}
	os.WriteFile(filepath.Join(dir, "ignored"), []byte("x"), 0o644)
	if s, _ := SourceTree(ctx, dir); s != clean {
		t.Fatalf("an ignored file changed the tree: %+v", s)
	}
	objects := git(t, dir, "count-objects")
	os.WriteFile(filepath.Join(dir, "new.go"), []byte("package a\n"), 0o644)
	dirty, err := SourceTree(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !dirty.Dirty || dirty.GitTree == clean.GitTree || dirty.GitHead != clean.GitHead {
		t.Fatalf("untracked file: %+v", dirty)
	}
	if st := git(t, dir, "status", "--porcelain"); st != "?? new.go" {
		t.Fatalf("the index changed: %q", st)
	}
	if got := git(t, dir, "count-objects"); got != objects {
		t.Fatalf("objects were written to the repository: %s -> %s", objects, got)
	}
	if _, err := SourceTree(ctx, t.TempDir()); err == nil {
		t.Fatal("SourceTree outside a repository succeeded")
	}
}

// A machine without the guest kernel still leaves a failing receipt for
// every suite, naming the missing kernel: nothing is skipped silently.
func TestMissingKernelLeavesFailingReceipts(t *testing.T) {
	out := t.TempDir()
	h := NewHost(context.Background(), Options{Dir: moduleRoot(t), Work: t.TempDir(), Out: out,
		KernelDir: filepath.Join(t.TempDir(), "no-kernel"), Accel: AccelTCG})
	if h.Ready() {
		t.Fatal("a host without a kernel is ready")
	}
	for _, run := range []func(context.Context, *Host) (*receipt.Receipt, error){RunIsolation, RunNative} {
		r, err := run(context.Background(), h)
		if err != nil {
			t.Fatal(err)
		}
		onDisk, err := receipt.CheckFile(out, r.Suite)
		if onDisk == nil || !errors.Is(err, receipt.ErrRejected) || !strings.Contains(err.Error(), "guest kernel") {
			t.Fatalf("%s: %v", r.Suite, err)
		}
	}
}

// TestPrebuiltEnvWiring: every variable the suite sets for a prebuilt main
// binary is the one that package's tests read (their explicit hook), so a
// rename on either side fails here rather than as a test in the guest
// trying to run go build where there is no toolchain.
func TestPrebuiltEnvWiring(t *testing.T) {
	root := moduleRoot(t)
	for pkg, env := range prebuiltEnv {
		tests, err := filepath.Glob(filepath.Join(root, pkg, "*_test.go"))
		if err != nil || len(tests) == 0 {
			t.Fatalf("%s: no test files (%v)", pkg, err)
		}
		found := false
		for _, f := range tests {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			found = found || bytes.Contains(src, []byte(`"`+env+`"`))
		}
		if !found {
			t.Errorf("%s: its tests never read %s", pkg, env)
		}
	}
	for _, kv := range guestEnv {
		if strings.HasPrefix(kv, "GOROOT=") || strings.Contains(kv, "/go/bin") {
			t.Errorf("guest environment %q points at a Go toolchain; the guest has none", kv)
		}
	}
}

// TestNotInGuestIsPinned: the tests the isolation suite leaves out are
// exactly these, and each exists. An exclusion hides a test from the
// receipt's gate, so a new one must change this test too and be seen in
// review; the receipt lists every exclusion with its reason.
func TestNotInGuestIsPinned(t *testing.T) {
	want := map[string][]string{"receiver/conformance": {"TestIntegrationVirtioSerial"},
		"receiver/spawn": {"TestCgroupV1Join", "TestSeccompDeniesAttacks", "TestSeccompDeniesUnshareTool",
			"TestSeccompWorkday", "TestSecurityMDListsEveryRule"},
		"receiver": {"TestIntegrationCgroupV1Limits"}}
	root := moduleRoot(t)
	n := 0
	for pkg, tests := range notInGuest {
		for name := range tests {
			n++
			if !slices.Contains(want[pkg], name) {
				t.Errorf("%s %s is excluded from the guest but not pinned here", pkg, name)
			}
			files, _ := filepath.Glob(filepath.Join(root, pkg, "*_test.go"))
			found := false
			for _, f := range files {
				src, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				found = found || bytes.Contains(src, []byte("func "+name+"("))
			}
			if !found {
				t.Errorf("%s %s is excluded but does not exist", pkg, name)
			}
		}
	}
	if n != 7 {
		t.Errorf("%d exclusions, want 7", n)
	}
}

// TestNativeSubtestsMatchThePipeline: suite (b) declares exactly the
// subtests fixtures/e2e's RunPipeline runs, so a new one is demanded in
// the VM too (not merely executed there) and a dropped one fails here.
func TestNativeSubtestsMatchThePipeline(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(moduleRoot(t), "fixtures", "e2e", "pipeline.go"))
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	start := strings.Index(body, "func RunPipeline(")
	end := strings.Index(body[start:], "t.Run(tc.name")
	if start < 0 || end < 0 {
		t.Fatal("RunPipeline's case list not found in fixtures/e2e/pipeline.go")
	}
	var cases []string
	for _, m := range regexp.MustCompile(`(?m)^\s*\{"([a-z0-9_]+)", `).FindAllStringSubmatch(body[start:start+end], -1) {
		cases = append(cases, m[1])
	}
	if !slices.Equal(cases, nativeSubtests) {
		t.Fatalf("RunPipeline runs %q\nsuite (b) declares %q", cases, nativeSubtests)
	}
}

// TestKeepConsole: a boot that fell short leaves the whole console beside
// its receipt; a clean boot removes one an earlier run left.
func TestKeepConsole(t *testing.T) {
	work, out := t.TempDir(), t.TempDir()
	src := filepath.Join(work, "console.log")
	whole := "[    1.0] BUG: unable to handle page fault\n" + strings.Repeat("line\n", 2*consoleTail) + "Kernel panic\n"
	if err := os.WriteFile(src, []byte(whole), 0o644); err != nil {
		t.Fatal(err)
	}
	name, err := KeepConsole(src, filepath.Join(out, "receipts"), "receiver-isolation", true)
	if err != nil {
		t.Fatal(err)
	}
	if name != "receiver-isolation.console.log" {
		t.Fatalf("kept as %q", name)
	}
	kept := filepath.Join(out, "receipts", name)
	got, err := os.ReadFile(kept)
	if err != nil || string(got) != whole {
		t.Fatalf("kept console is not the whole console (err %v, %d of %d bytes)", err, len(got), len(whole))
	}
	if name, err := KeepConsole(src, filepath.Join(out, "receipts"), "receiver-isolation", false); err != nil || name != "" {
		t.Fatalf("clean boot: name %q, err %v", name, err)
	}
	if _, err := os.Stat(kept); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a clean boot left the earlier console beside its receipt: %v", err)
	}
	if _, err := KeepConsole(filepath.Join(work, "missing.log"), out, "s", true); err == nil {
		t.Fatal("a missing console was kept without an error")
	}
}
