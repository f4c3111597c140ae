// Package securitymd checks SECURITY.md against the code: every control
// labelled enforced+tested must name at least one test, and every test it
// names must exist. A renamed or deleted test therefore fails CI instead of
// leaving a claim behind that nothing backs.
package securitymd

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// `pkg/path.TestName`, `pkg.FuzzX*`, `pkg.TestX/sub`.
	goRef = regexp.MustCompile("`([a-z0-9_./-]+)\\.((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*\\*?)(?:/[^`]*)?`")
	// `name.txtar`
	txtarRef = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.txtar)`")
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "SECURITY.md")); err != nil {
		t.Fatalf("SECURITY.md not found from the test directory: %v", err)
	}
	return root
}

// testFuncs returns the names of Test/Fuzz/Benchmark functions declared in
// the _test.go files of one package directory.
func testFuncs(t *testing.T, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			names = append(names, string(m[1]))
		}
	}
	return names
}

func hasTest(names []string, want string) bool {
	prefix, wild := strings.CutSuffix(want, "*")
	for _, n := range names {
		if n == want || (wild && strings.HasPrefix(n, prefix)) {
			return true
		}
	}
	return false
}

func txtarFiles(t *testing.T, root string) map[string]bool {
	t.Helper()
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == ".git" || d.Name() == ".cache") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, ".txtar") {
			found[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestEveryTestedControlNamesRealTests(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	txtars := txtarFiles(t, root)
	cache := map[string][]string{}
	rows, refs := 0, 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, "|") || !strings.Contains(line, "enforced+tested") || strings.Contains(line, "**enforced+tested**") {
			continue
		}
		rows++
		named := 0
		for _, m := range goRef.FindAllStringSubmatch(line, -1) {
			pkg, fn := m[1], m[2]
			dir := filepath.Join(root, filepath.FromSlash(pkg))
			if pkg == "tether" || pkg == "." {
				dir = root
			}
			if _, ok := cache[dir]; !ok {
				cache[dir] = testFuncs(t, dir)
			}
			if !hasTest(cache[dir], fn) {
				t.Errorf("SECURITY.md:%d names %s.%s, which does not exist", n, pkg, fn)
			}
			named++
		}
		for _, m := range txtarRef.FindAllStringSubmatch(line, -1) {
			if !txtars[filepath.Base(m[1])] {
				t.Errorf("SECURITY.md:%d names %s, which does not exist", n, m[1])
			}
			named++
		}
		if named == 0 {
			t.Errorf("SECURITY.md:%d is enforced+tested but names no test: %s", n, line)
		}
		refs += named
	}
	if rows < 10 {
		t.Fatalf("found only %d enforced+tested rows; is SECURITY.md's table format unchanged?", rows)
	}
	t.Logf("%d enforced+tested controls, %d test references checked", rows, refs)
}
