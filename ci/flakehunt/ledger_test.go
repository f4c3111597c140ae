package flakehunt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repo makes a git repository with one committed file and returns its
// directory.
func repo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	gitRun(t, dir, "init", "-q")
	write(t, filepath.Join(dir, "a.go"), "package a\n")
	commitAll(t, dir, "a")
	return dir
}

func gitRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func commitAll(t *testing.T, dir, msg string) string {
	t.Helper()
	gitRun(t, dir, "add", "-A")
	gitRun(t, dir, "commit", "-q", "-m", msg)
	return gitRun(t, dir, "rev-parse", "HEAD")
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// entry is a report of one hunt slice made at head: each named test ran
// runs times (failing fails times), its package as often, plus vm VM runs.
func entry(head string, start time.Time, runs, fails, vm int, tests ...string) *Report {
	r := &Report{Started: start, Ended: start.Add(time.Minute),
		Config: Config{GitHead: head, Packages: []string{"./..."}, Rounds: 1, Count: runs}}
	ty := NewTally()
	for _, n := range tests {
		ty.merge(TestTally{Package: "p", Name: n, Runs: runs, Passes: runs - fails, Failures: fails})
	}
	ty.mergePackage(PackageTally{Package: "p", Runs: runs})
	for i := range vm {
		r.VM = append(r.VM, VMRun{Run: i + 1, Passed: true})
	}
	r.build(ty)
	return r
}

func sum(t *testing.T, dir, ledger string, goal int) *Ledger {
	t.Helper()
	l, err := Sum(context.Background(), dir, ledger, goal)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLedgerAddsUpSlicesOfOneTree: two slices filed at one commit add up
// to the goal; committing the entries (inside the ledger) keeps them
// counted; a commit outside the ledger makes both stale, so the sum is
// always about the code as it is.
func TestLedgerAddsUpSlicesOfOneTree(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	ledger := filepath.Join(dir, "ci", "ledger")
	head := gitRun(t, dir, "rev-parse", "HEAD")
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for i, r := range []*Report{entry(head, t0, 12, 0, 8, "TestA", "TestB"), entry(head, t0.Add(time.Hour), 8, 0, 12, "TestA", "TestB")} {
		path, err := File(ctx, dir, ledger, r)
		if err != nil {
			t.Fatalf("file slice %d: %v", i, err)
		}
		if !strings.HasSuffix(path, "-"+head[:12]+".json") {
			t.Errorf("entry named %s", path)
		}
	}
	l := sum(t, dir, ledger, 20)
	if !l.Met() || len(l.Entries) != 2 || len(l.Stale) != 0 || l.Report.Totals.TestRuns != 40 ||
		l.Report.Totals.PackageRuns != 20 || len(l.Report.VM) != 20 || l.Report.Spent != 2*time.Minute {
		t.Fatalf("two slices of 20: met %t, %+v, entries %v stale %v", l.Met(), l.Report.Totals, l.Entries, l.Stale)
	}
	var out bytes.Buffer
	l.Print(&out)
	if !strings.Contains(out.String(), "(2 ledger entries added up), 0 failures") || !strings.Contains(out.String(), "goal MET: every test at least 20 runs: 0 of 2 tests are below; VM runs 20 of 20") {
		t.Errorf("print:\n%s", out.String())
	}
	if l := sum(t, dir, ledger, 21); l.Met() || len(l.Below) != 2 || l.Below[0].Runs != 20 {
		t.Errorf("goal 21 met with 20 runs: %+v", l.Below)
	}

	commitAll(t, dir, "file the slices")
	if l := sum(t, dir, ledger, 20); !l.Met() || len(l.Entries) != 2 {
		t.Fatalf("committing the entries made them stale: %v", l.Stale)
	}

	write(t, filepath.Join(dir, "docs", "x.md"), "a doc a test may read\n")
	commitAll(t, dir, "change outside the ledger")
	l = sum(t, dir, ledger, 20)
	if l.Met() || len(l.Entries) != 0 || len(l.Stale) != 2 || !strings.Contains(l.Stale[0], "1 files changed since, first docs/x.md") {
		t.Fatalf("entries of an older tree still counted: entries %v stale %v", l.Entries, l.Stale)
	}
}

// TestLedgerRefusesWhatNoCommitNames: a dirty work tree (an untracked file
// counts, one inside the ledger does not) cannot be hunted into the
// ledger, a report whose head moved is not filed, and entries that are
// dirty, unreadable or of an unknown commit are stale.
func TestLedgerRefusesWhatNoCommitNames(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	ledger := filepath.Join(dir, "ledger")
	head := gitRun(t, dir, "rev-parse", "HEAD")
	write(t, filepath.Join(ledger, "notes.txt"), "inside the ledger\n")
	if err := CheckFileable(ctx, dir, ledger); err != nil {
		t.Fatalf("a file inside the ledger made the tree dirty: %v", err)
	}
	write(t, filepath.Join(dir, "b.go"), "package a\n")
	if err := CheckFileable(ctx, dir, ledger); !errors.Is(err, ErrLedger) || !strings.Contains(err.Error(), "b.go") {
		t.Fatalf("an untracked source file: %v", err)
	}
	if _, err := Run(ctx, Options{Dir: dir, Out: t.TempDir(), Count: 1, Inputs: []string{"none"}, Ledger: ledger}); !errors.Is(err, ErrLedger) {
		t.Fatalf("a hunt from a dirty tree started: %v", err)
	}
	if err := CheckFileable(ctx, dir, t.TempDir()); !errors.Is(err, ErrLedger) {
		t.Fatalf("a ledger outside the module: %v", err)
	}
	os.Remove(filepath.Join(dir, "b.go"))
	if _, err := File(ctx, dir, ledger, entry("0123456789abcdef", time.Now(), 1, 0, 0, "TestA")); !errors.Is(err, ErrLedger) {
		t.Fatalf("a report of another head was filed: %v", err)
	}

	dirty := entry(head, time.Now(), 30, 0, 30, "TestA")
	dirty.Config.Dirty = true
	for name, r := range map[string]*Report{"dirty": dirty, "unknown": entry("0123456789abcdef0123456789abcdef01234567", time.Now(), 30, 0, 30, "TestA")} {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(ledger, name+".json"), string(data))
	}
	write(t, filepath.Join(ledger, "junk.json"), "{not json")
	l := sum(t, dir, ledger, 20)
	stale := strings.Join(l.Stale, "\n")
	if len(l.Entries) != 0 || len(l.Stale) != 3 || !strings.Contains(stale, "dirty work tree") ||
		!strings.Contains(stale, "not in this history") || !strings.Contains(stale, "not a report") || l.Met() {
		t.Fatalf("stale entries counted: entries %v\n%s", l.Entries, stale)
	}
}

// TestLedgerFailuresAndCoverage: without a whole-tree entry the goal is
// not met, since a test no slice ran would go unseen; benchmarks (run once
// by make test) are not held to it; an entry with a failure never meets
// the goal however many runs.
func TestLedgerFailuresAndCoverage(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	ledger := filepath.Join(dir, "ledger")
	head := gitRun(t, dir, "rev-parse", "HEAD")
	slice := entry(head, time.Now(), 20, 0, 20, "TestA")
	slice.Config.Packages = []string{"./p/..."}
	if _, err := File(ctx, dir, ledger, slice); err != nil {
		t.Fatal(err)
	}
	if l := sum(t, dir, ledger, 20); l.Met() || l.Whole {
		t.Fatalf("met without a whole-tree entry")
	}
	whole := entry(head, time.Now().Add(time.Second), 1, 0, 0, "BenchmarkB", "BenchmarkB/sub")
	if _, err := File(ctx, dir, ledger, whole); err != nil {
		t.Fatal(err)
	}
	if l := sum(t, dir, ledger, 20); !l.Met() || len(l.Report.Tests) != 3 {
		t.Fatalf("benchmarks run once held to the goal: %+v", l.Below)
	}
	if _, err := File(ctx, dir, ledger, entry(head, time.Now().Add(2*time.Second), 1, 1, 0, "TestA")); err != nil {
		t.Fatal(err)
	}
	l := sum(t, dir, ledger, 20)
	if l.Met() || !l.Whole || l.Report.Totals.Failures != 1 || l.Report.Totals.TestRuns != 23 || !strings.Contains(l.Report.Summary[0], "FAILURES") {
		t.Fatalf("a failure in one slice: met %t %+v", l.Met(), l.Report.Totals)
	}
}

// TestRunFilesIntoTheLedger: a hunt with Ledger set (here counting an
// earlier go test -json file) files its report under HEAD.
func TestRunFilesIntoTheLedger(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	in := filepath.Join(t.TempDir(), "test.json")
	write(t, in, `{"Action":"run","Package":"p","Test":"TestA"}`+"\n"+`{"Action":"pass","Package":"p","Test":"TestA"}`+"\n"+`{"Action":"pass","Package":"p"}`+"\n")
	ledger := filepath.Join(dir, "ledger")
	if _, err := Run(ctx, Options{Dir: dir, Out: t.TempDir(), Count: 1, Inputs: []string{in}, Ledger: ledger}); err != nil {
		t.Fatal(err)
	}
	l := sum(t, dir, ledger, 1)
	if len(l.Entries) != 1 || l.Report.Totals.TestRuns != 1 || l.Report.Totals.PackageRuns != 1 || len(l.Below) != 0 {
		t.Fatalf("filed hunt: %v %+v", l.Entries, l.Report.Totals)
	}
}

// TestFileNeverReplacesAnEntry: two slices started in the same second at
// one commit (a -read filed just before a hunt) are both kept and both
// counted; neither replaces the other.
func TestFileNeverReplacesAnEntry(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	ledger := filepath.Join(dir, "ci", "ledger")
	head := gitRun(t, dir, "rev-parse", "HEAD")
	t0 := time.Date(2026, 12, 3, 15, 51, 6, 0, time.UTC)
	var paths []string
	for _, runs := range []int{1, 4, 2} {
		path, err := File(ctx, dir, ledger, entry(head, t0, runs, 0, 0, "TestA"))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.Base(path))
	}
	stem := "20261203T155106Z-" + head[:12]
	want := []string{stem + ".json", stem + "-2.json", stem + "-3.json"}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("filed as %v, want %v", paths, want)
	}
	if left, _ := filepath.Glob(filepath.Join(ledger, "*.tmp")); len(left) > 0 {
		t.Fatalf("temporary files left in the ledger: %v", left)
	}
	l := sum(t, dir, ledger, 7)
	if len(l.Entries) != 3 || l.Report.Tests[0].Runs != 7 {
		t.Fatalf("sum counted %d entries and %d runs, want 3 and 7: %+v", len(l.Entries), l.Report.Tests[0].Runs, l)
	}
}

// TestLedgerShowsConditions: entries run with busy loops beside or with
// CGO_ENABLED=0 add up like any other, and the sum names each condition
// with how many entries ran under it.
func TestLedgerShowsConditions(t *testing.T) {
	ctx := context.Background()
	dir := repo(t)
	ledger := filepath.Join(dir, "ledger")
	head := gitRun(t, dir, "rev-parse", "HEAD")
	t0 := time.Date(2026, 12, 6, 16, 0, 0, 0, time.UTC)
	loaded := entry(head, t0, 10, 0, 0, "TestA")
	loaded.Config.Hog, loaded.Config.CgoEnabled = 2, "0"
	vmOnly := entry(head, t0.Add(2*time.Second), 0, 0, 20)
	vmOnly.Config.Rounds = 0
	for _, r := range []*Report{entry(head, t0.Add(time.Second), 10, 0, 0, "TestA"), loaded, vmOnly} {
		if _, err := File(ctx, dir, ledger, r); err != nil {
			t.Fatal(err)
		}
	}
	l := sum(t, dir, ledger, 20)
	if !l.Met() || l.Report.Tests[0].Runs != 20 {
		t.Fatalf("entries with a hog or without cgo not added up: met %t %+v", l.Met(), l.Report.Tests)
	}
	var out bytes.Buffer
	l.Print(&out)
	want := "  conditions: 1 entry: hog 2, CGO_ENABLED=0; 1 entry: no hog, CGO_ENABLED not recorded; 1 entry: no hog, no go test rounds\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("print lacks %q:\n%s", want, out.String())
	}
}
