package contract

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tetherdev/tether/"

// contractDeps are the only packages of this module the contract may link:
// the admission leaves, admission/acperr (the ACP SDK's error of
// acpmeta's shape, which the adapters carry) and the generated proto. No
// implementation (the
// binding table, the server, the tool plans, the host library) is among
// them, so a host or a plugin that imports the contract imports no side's
// machinery.
var contractDeps = map[string]bool{
	module + "admission":            true,
	module + "admission/errcode":    true,
	module + "admission/acpmeta":    true,
	module + "admission/strictjson": true,
	module + "admission/acperr":     true,
	module + "plugin/proto":         true,
	module + "plugin/contract":      true,
}

func contractDep(d string) bool {
	return !strings.HasPrefix(d, module) || contractDeps[d]
}

// TestContractLinksNoImplementation reads the contract's whole import graph
// with go list -deps (for Linux, darwin and windows) and fails on any
// package of this module outside contractDeps. It requires plugin/proto in
// the graph, so an empty or failed listing cannot pass.
func TestContractLinksNoImplementation(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		cmd := exec.Command("go", "list", "-deps", ".")
		cmd.Env = append(cmd.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOOS=%s go list -deps: %v", goos, err)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			if !contractDep(d) {
				t.Errorf("GOOS=%s: plugin/contract links %s", goos, d)
			}
		}
		if !slices.Contains(deps, module+"plugin/proto") {
			t.Errorf("GOOS=%s: plugin/contract does not list plugin/proto: is the listing complete?", goos)
		}
	}
}

// TestContractDepRefusesImplementations is the positive control: the
// check refuses each implementation package, so the test above would fail
// if the contract imported one.
func TestContractDepRefusesImplementations(t *testing.T) {
	for _, impl := range []string{"plugin/binding", "plugin/server", "plugin/toolplan", "plugin/host", "receiver/wire", "custodian"} {
		if contractDep(module + impl) {
			t.Errorf("contractDep allows %s", impl)
		}
	}
}
