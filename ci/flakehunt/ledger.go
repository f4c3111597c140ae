package flakehunt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ErrLedger is wrapped by every refusal to file or count a ledger entry.
var ErrLedger = errors.New("flakehunt: ledger")

// A ledger is a directory, committed with the code, of hunt reports made
// on one source tree. The whole suite at -count 20 takes longer than one
// working session on a 2-core machine, so the hunt is done in slices
// (packages, rounds, VM runs) and each slice's report is filed here. Sum
// adds up the entries made on the tree HEAD has now, outside the ledger
// itself: changing any other file, code, test or doc, makes every earlier
// entry stale, so the sum is always about the code as it is.

// CheckFileable refuses to hunt into a ledger from a tree that a commit
// does not name: a dirty work tree (untracked files count, the ledger's own
// files do not) or no git at all. Run calls it before the first round, so
// hours are not spent on evidence that could not be filed.
func CheckFileable(ctx context.Context, dir, ledger string) error {
	rel, err := ledgerPath(dir, ledger)
	if err != nil {
		return err
	}
	if _, err := git(ctx, dir, "rev-parse", "--verify", "HEAD"); err != nil {
		return fmt.Errorf("%w: the module has no git HEAD to file the hunt under: %w", ErrLedger, err)
	}
	out, err := git(ctx, dir, "status", "--porcelain", "--", ".", ":(exclude)"+rel)
	if err != nil {
		return fmt.Errorf("%w: git status: %w", ErrLedger, err)
	}
	if out != "" {
		return fmt.Errorf("%w: the work tree differs from HEAD outside %s, so no commit names what would be tested; commit or stash first:\n%s",
			ErrLedger, rel, out)
	}
	return nil
}

// File writes r into the ledger as STARTED-HEAD.json and returns its
// path. The report must name a clean HEAD (CheckFileable's check, made
// again here in case the tree changed during the hunt). It never replaces
// an entry: two slices started in the same second at one commit (a -read
// filed just before a hunt) are both kept, the later as STARTED-HEAD-2.json.
func File(ctx context.Context, dir, ledger string, r *Report) (string, error) {
	if err := CheckFileable(ctx, dir, ledger); err != nil {
		return "", err
	}
	head, err := git(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrLedger, err)
	}
	if r.Config.GitHead != head {
		return "", fmt.Errorf("%w: the hunt started at %s but HEAD is now %s; not filed", ErrLedger, short(r.Config.GitHead), short(head))
	}
	if err := os.MkdirAll(ledger, 0o755); err != nil {
		return "", err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	base := filepath.Join(ledger, r.Started.UTC().Format("20060102T150405Z")+"-"+short(head))
	return writeNew(base, data)
}

// writeNew writes data and a newline to the first of base.json,
// base-2.json, … that does not exist yet and returns its name. The entry
// is written whole under a temporary name first and then linked: link
// refuses an existing name, so an entry is never replaced, even by a
// hunt filing at the same moment.
func writeNew(base string, data []byte) (string, error) {
	tmp := base + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	for n := 1; n <= maxSameName; n++ {
		name := base + ".json"
		if n > 1 {
			name = fmt.Sprintf("%s-%d.json", base, n)
		}
		err := os.Link(tmp, name)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("%w: file the entry: %w", ErrLedger, err)
		}
	}
	return "", fmt.Errorf("%w: %d entries already named %s*.json; not filed", ErrLedger, maxSameName, base)
}

// maxSameName bounds the entries filed under one second and commit.
const maxSameName = 100

// Ledger is the sum of a ledger's entries made on HEAD's tree.
type Ledger struct {
	Head    string      `json:"head"`
	Goal    int         `json:"goal"`    // runs every test, and VM runs, must reach
	Entries []string    `json:"entries"` // counted
	Stale   []string    `json:"stale"`   // not counted, each with the reason
	Whole   bool        `json:"whole_tree"`
	Report  *Report     `json:"report"`     // the entries added up
	Below   []TestTally `json:"below_goal"` // tests with fewer than Goal runs, fewest first
	// Conditions are the counted entries' conditions (busy loops beside,
	// CGO_ENABLED), each with how many entries ran under it.
	Conditions []string `json:"conditions"`
}

// Sum reads every entry in the ledger and adds up those made on the tree
// HEAD has now (outside the ledger). Entries made on another tree are
// listed as stale with the reason and not counted.
func Sum(ctx context.Context, dir, ledger string, goal int) (*Ledger, error) {
	rel, err := ledgerPath(dir, ledger)
	if err != nil {
		return nil, err
	}
	head, err := git(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return nil, fmt.Errorf("%w: the module has no git HEAD: %w", ErrLedger, err)
	}
	files, err := filepath.Glob(filepath.Join(ledger, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	l := &Ledger{Head: head, Goal: goal, Report: &Report{}}
	ty := NewTally()
	conds := map[string]int{}
	for _, f := range files {
		r, err := readEntry(f)
		if err == nil {
			err = sameTree(ctx, dir, rel, r.Config)
		}
		if err != nil {
			l.Stale = append(l.Stale, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		l.add(f, r, ty)
		conds[condition(r.Config)]++
	}
	for c, n := range conds {
		noun := "entries"
		if n == 1 {
			noun = "entry"
		}
		l.Conditions = append(l.Conditions, fmt.Sprintf("%d %s: %s", n, noun, c))
	}
	sort.Strings(l.Conditions)
	l.Report.build(ty)
	l.Report.Config = Config{GitHead: head, Packages: []string{"(ledger sum)"}, Entries: len(l.Entries), UID: -1} // -1: entries may differ, so the sum names no uid
	l.Report.Summary = l.Report.summarize()
	l.below()
	return l, nil
}

func readEntry(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: not a report: %w", ErrLedger, err)
	}
	return &r, nil
}

// sameTree checks that an entry was made on HEAD's tree outside the
// ledger, from a clean work tree.
func sameTree(ctx context.Context, dir, rel string, c Config) error {
	switch {
	case c.GitHead == "":
		return fmt.Errorf("%w: names no commit", ErrLedger)
	case c.Dirty:
		return fmt.Errorf("%w: made from a dirty work tree at %s", ErrLedger, short(c.GitHead))
	}
	out, err := git(ctx, dir, "diff", "--name-only", c.GitHead, "HEAD", "--", ".", ":(exclude)"+rel)
	if err != nil {
		return fmt.Errorf("%w: commit %s is not in this history: %w", ErrLedger, short(c.GitHead), err)
	}
	if out != "" {
		n := strings.Count(out, "\n") + 1
		return fmt.Errorf("%w: made at %s; %d files changed since, first %s", ErrLedger, short(c.GitHead), n, strings.SplitN(out, "\n", 2)[0])
	}
	return nil
}

// add counts one entry's tests, packages, VM runs and time.
func (l *Ledger) add(path string, r *Report, ty *Tally) {
	l.Entries = append(l.Entries, filepath.Base(path))
	for _, t := range r.Tests {
		ty.merge(t)
	}
	for _, p := range r.Packages {
		ty.mergePackage(p)
	}
	l.Report.VM = append(l.Report.VM, r.VM...)
	l.Report.Spent += r.duration()
	if r.Config.Rounds > 0 || len(r.Config.Inputs) > 0 {
		l.Whole = l.Whole || wholeTree(r.Config.Packages)
	}
}

// condition names the conditions an entry ran under beside its code:
// the busy loops beside it (-hog) and the CGO_ENABLED of its go test
// rounds (-cgo), which entries filed before it was recorded do not name.
func condition(c Config) string {
	hog := "no hog"
	if c.Hog > 0 {
		hog = fmt.Sprintf("hog %d", c.Hog)
	}
	cgo := "CGO_ENABLED=" + c.CgoEnabled
	switch {
	case c.Rounds == 0 && len(c.Inputs) == 0:
		cgo = "no go test rounds"
	case c.CgoEnabled == "":
		cgo = "CGO_ENABLED not recorded"
	}
	return hog + ", " + cgo
}

func wholeTree(pkgs []string) bool {
	for _, p := range pkgs {
		if p == "./..." {
			return true
		}
	}
	return false
}

// below lists the tests that ran fewer than Goal times. Benchmarks are
// not held to the goal: make test runs each once (-benchtime 1x) and the
// hunt's rounds run none; a benchmark that failed still fails the sum.
func (l *Ledger) below() {
	for _, t := range l.Report.Tests {
		if t.Runs < l.Goal && !strings.HasPrefix(t.Name, "Benchmark") {
			l.Below = append(l.Below, t)
		}
	}
	sort.SliceStable(l.Below, func(i, j int) bool { return l.Below[i].Runs < l.Below[j].Runs })
}

// Met reports whether the ledger reaches its goal: a whole-tree entry,
// every test run at least Goal times and at least Goal VM runs, and
// nothing failed.
func (l *Ledger) Met() bool {
	return l.Whole && len(l.Below) == 0 && len(l.Report.VM) >= l.Goal && l.Report.Clean() && len(l.Report.Tests) > 0
}

// Print writes the ledger's summary: what was counted, the report's
// summary, and how far from the goal it is.
func (l *Ledger) Print(w io.Writer) {
	fmt.Fprintf(w, "ledger: %d entries made on this tree (HEAD %s), %d stale and not counted\n", len(l.Entries), short(l.Head), len(l.Stale))
	for _, s := range l.Stale {
		fmt.Fprintf(w, "  stale %s\n", s)
	}
	if len(l.Conditions) > 0 {
		fmt.Fprintf(w, "  conditions: %s\n", strings.Join(l.Conditions, "; "))
	}
	l.Report.Print(w)
	verdict := "MET"
	if !l.Met() {
		verdict = "NOT MET"
	}
	fmt.Fprintf(w, "goal %s: every test at least %d runs: %d of %d tests are below; VM runs %d of %d; whole tree in an entry: %t\n",
		verdict, l.Goal, len(l.Below), len(l.Report.Tests), len(l.Report.VM), l.Goal, l.Whole)
	for i, t := range l.Below {
		if i == 10 {
			fmt.Fprintf(w, "  ... and %d more\n", len(l.Below)-i)
			break
		}
		fmt.Fprintf(w, "  %d runs: %s %s\n", t.Runs, t.Package, t.Name)
	}
}

// ledgerPath returns the ledger's path relative to the module root, which
// it must be inside (its entries are committed with the code).
func ledgerPath(dir, ledger string) (string, error) {
	abs, err := filepath.Abs(ledger)
	if err != nil {
		return "", err
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%w: %s is not a directory inside the module", ErrLedger, ledger)
	}
	return filepath.ToSlash(rel), nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// duration is how long a hunt ran.
func (r *Report) duration() time.Duration {
	if r.Spent > 0 {
		return r.Spent
	}
	return r.Ended.Sub(r.Started)
}
