package admission

import (
	"os/exec"
	"strings"
	"testing"
)

// leaves are the packages of the shared contract. Each imports the
// standard library and other leaves only (plus the external modules
// leafExternal allows it), so importing the contract links nothing else of
// tether. plugin/host's TestPluginLinksOnlyTheContract checks the other
// side: what the plugin binary must not link.
var leaves = map[string]bool{
	"github.com/tetherdev/tether/admission":            true,
	"github.com/tetherdev/tether/admission/errcode":    true,
	"github.com/tetherdev/tether/admission/acpmeta":    true,
	"github.com/tetherdev/tether/admission/strictjson": true,
	"github.com/tetherdev/tether/admission/atomicfile": true,
	"github.com/tetherdev/tether/admission/backoff":    true,
}

// leafExternal maps a leaf to the one module outside the standard library
// it may import. None may: acpmeta's ACP SDK glue is admission/acperr.
var leafExternal = map[string]string{}

// TestLeavesImportOnlyLeaves reads each leaf's imports with go list (for
// Linux, darwin and windows: a leaf has no OS-specific imports either).
func TestLeavesImportOnlyLeaves(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		args := []string{"list", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}"}
		for l := range leaves {
			args = append(args, l)
		}
		cmd := exec.Command("go", args...)
		cmd.Env = append(cmd.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOOS=%s go list: %v", goos, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != len(leaves) {
			t.Fatalf("GOOS=%s: listed %d packages, want %d:\n%s", goos, len(lines), len(leaves), out)
		}
		for _, line := range lines {
			pkg, imports, _ := strings.Cut(line, ":")
			for _, imp := range strings.Fields(imports) {
				if !leafImport(pkg, imp) {
					t.Errorf("GOOS=%s: leaf %s imports %s", goos, pkg, imp)
				}
			}
		}
	}
}

func leafImport(pkg, imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".") || leaves[imp] || leafExternal[pkg] == imp
}
