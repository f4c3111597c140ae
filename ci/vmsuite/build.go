package vmsuite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Module is the module path every package name here is relative to.
const Module = "github.com/tetherdev/tether"

// Builder compiles the binaries a suite places in its image: static
// (CGO_ENABLED=0) linux/amd64, -trimpath, no VCS stamp, so the same source
// gives the same SHA-256 on any checkout. Overlay, if set, is passed as
// `go -overlay` (see Mutation); it never touches the source tree.
type Builder struct {
	Dir     string // the module root
	Out     string // where binaries are written
	Overlay string // optional overlay file
	Tags    string // optional build tags
}

func (b Builder) goCmd(ctx context.Context, args ...string) *exec.Cmd {
	flags := []string{"-trimpath", "-buildvcs=false"}
	if b.Overlay != "" {
		flags = append(flags, "-overlay", b.Overlay)
	}
	if b.Tags != "" {
		flags = append(flags, "-tags", b.Tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(append(args[:1:1], flags...), args[1:]...)...)
	cmd.Dir = b.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	return cmd
}

func run(cmd *exec.Cmd) error {
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// TestPackages expands patterns (e.g. "./receiver/...") to the import
// paths of the packages that have tests, sorted.
func (b Builder) TestPackages(ctx context.Context, patterns ...string) ([]string, error) {
	return b.list(ctx, "{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}", patterns...)
}

// MainPackages returns which of pkgs are main packages (commands).
func (b Builder) MainPackages(ctx context.Context, pkgs ...string) (map[string]bool, error) {
	mains, err := b.list(ctx, `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, pkgs...)
	out := map[string]bool{}
	for _, m := range mains {
		out[m] = true
	}
	return out, err
}

// list runs `go list -f format patterns` and returns the non-empty
// lines, sorted.
func (b Builder) list(ctx context.Context, format string, patterns ...string) ([]string, error) {
	cmd := b.goCmd(ctx, append([]string{"list", "-f", format}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %v: %w: %s", patterns, err, bytes.TrimSpace(stderr.Bytes()))
	}
	pkgs := strings.Fields(string(out))
	sort.Strings(pkgs)
	return pkgs, nil
}

// TestBinary is one compiled test binary.
type TestBinary struct {
	Package string   // import path
	Rel     string   // package path relative to the module ("receiver/spawn")
	Path    string   // host path of the binary
	Tests   []string // top-level tests, fuzz targets and examples it runs
	Skip    string   // -test.skip pattern of the tests it must not run ("" for none)
}

// BuildTests compiles the test binary of each package (no -race: the
// guest has no libc for the race runtime) and lists the tests each one
// runs without flags. The result is in pkgs order.
func (b Builder) BuildTests(ctx context.Context, pkgs []string) ([]TestBinary, error) {
	var out []TestBinary
	for _, p := range pkgs {
		rel, err := relPackage(p)
		if err != nil {
			return nil, err
		}
		bin := filepath.Join(b.Out, strings.ReplaceAll(rel, "/", "_")+".test")
		if err := run(b.goCmd(ctx, "test", "-c", "-o", bin, p)); err != nil {
			return nil, err
		}
		tests, err := listTests(ctx, bin, filepath.Join(b.Dir, rel))
		if err != nil {
			return nil, err
		}
		out = append(out, TestBinary{Package: p, Rel: rel, Path: bin, Tests: tests})
	}
	return out, nil
}

// Build compiles the main package pkg to out.
func (b Builder) Build(ctx context.Context, pkg, out string) error {
	return run(b.goCmd(ctx, "build", "-o", out, pkg))
}

func relPackage(p string) (string, error) {
	rel, ok := strings.CutPrefix(p, Module+"/")
	if !ok {
		return "", fmt.Errorf("package %s is outside module %s", p, Module)
	}
	return rel, nil
}

// listTests asks a test binary which tests it would run (-test.list); a
// test binary lists benchmarks too, which a suite never runs.
func listTests(ctx context.Context, bin, dir string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.list", ".*")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no helper-mode variable can leak in
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -test.list: %w", filepath.Base(bin), err)
	}
	var tests []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "Benchmark") {
			continue
		}
		if !strings.HasPrefix(name, "Test") && !strings.HasPrefix(name, "Fuzz") && !strings.HasPrefix(name, "Example") {
			return nil, fmt.Errorf("%s -test.list printed %q, not a test name", filepath.Base(bin), name)
		}
		tests = append(tests, name)
	}
	return tests, nil
}

// writeOverlay writes a `go -overlay` file replacing each source file
// (absolute path) by the contents given.
func writeOverlay(dir string, files map[string][]byte) (string, error) {
	replace := map[string]string{}
	i := 0
	for src, data := range files {
		p := filepath.Join(dir, fmt.Sprintf("overlay-%d-%s", i, filepath.Base(src)))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return "", err
		}
		replace[src] = p
		i++
	}
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "overlay.json")
	return p, os.WriteFile(p, b, 0o644)
}
