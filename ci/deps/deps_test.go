// Package deps checks the dependency rules of docs/architecture.md
// ("Dependency rules") against the real import graph, read with go list,
// so that the rules cannot drift from the code again.
package deps

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/tetherdev/tether/"

// leaves are the contract packages: each imports the standard library and
// other leaves only, on every GOOS (docs/architecture.md, "Where the files
// are": the shared contract row, and receiver/wire).
var leaves = []string{
	"admission",
	"admission/errcode",
	"admission/acpmeta",
	"admission/strictjson",
	"admission/cli",
	"admission/atomicfile",
	"admission/backoff",
	"receiver/wire",
	"computer/api",
	"egress/policy",
}

// pluginContract is the plugin's contract package, the one the plugin and
// its hosts share.
const pluginContract = "plugin/contract"

// rule is one "never links" rule: no package of from (go list patterns,
// relative to the module) may have a package of forbid (a path, or a path
// ending in "/" for a whole tree) among its dependencies, and each package
// of require must be there, so an empty or failed listing cannot pass.
type rule struct {
	name    string
	from    []string
	forbid  []string
	require []string
	// pending names why a rule is not enforced yet: its violations are
	// logged, not failed. Empty for every enforced rule.
	pending string
}

var rules = []rule{
	{
		name:    "the custodian links the wire contract and its client, never the wire server",
		from:    []string{"custodian/..."},
		forbid:  []string{"receiver/wireserver"},
		require: []string{"receiver/wire", "receiver/wireclient"},
	},
	{
		name: "the plugin binary links only the contract",
		from: []string{"plugin/cmd/tether-plugin", "plugin/host"},
		forbid: []string{"receiver/", "custodian/", "admission/signedfile", "admission/signing",
			"admission/coordinator"},
		require: []string{"admission/errcode", "admission/acpmeta"},
	},
	{
		name:    "the plugin's contract package imports no implementation",
		from:    []string{pluginContract},
		forbid:  []string{"plugin/binding", "plugin/server", "plugin/toolplan"},
		require: []string{"admission/errcode"},
	},
	{
		name: "no shipped binary links a fixture",
		from: []string{"admission/cmd/tether-admission", "receiver/cmd/tether-receiver",
			"custodian/cmd/tether-custodian", "plugin/cmd/tether-plugin", "computer/cmd/tether-computer"},
		forbid:  []string{"fixtures/"},
		require: []string{"admission"},
	},
	{
		name: "the computer service's core links no fixture, no HTTP and no provisioner; only the contract",
		from: []string{"computer/lifecycle", "computer/service"},
		forbid: []string{"fixtures/", "net/http", "computer/httpserver", "computer/provision", "receiver/",
			"custodian/"},
		require: []string{"computer/api"},
	},
	{
		name:    "the provisioner links no fixture",
		from:    []string{"computer/provision"},
		forbid:  []string{"fixtures/"},
		require: []string{"admission", "computer/pki", "computer/ports", "computer/bins"},
	},
	{
		name:    "the VM provisioner and its guest agent link no fixture",
		from:    []string{"computer/vm/...", "computer/cmd/tether-vmguest"},
		forbid:  []string{"fixtures/"},
		require: []string{"computer/api", "computer/vm/muxlink", "computer/provision"},
	},
	{
		name: "the egress proxy links no fixture and nothing of the computer service but its contract",
		from: []string{"egress/..."},
		forbid: []string{"fixtures/", "computer/service", "computer/httpserver", "computer/provision", "computer/lifecycle",
			"receiver/", "custodian/", "plugin/"},
		require: []string{"egress/policy"},
	},
	{
		name: "the lab network (the demo's small internet) links no fixture and nothing of tether",
		from: []string{"egress/labnet"},
		forbid: []string{"fixtures/", "egress/policy", "computer/", "receiver/", "custodian/", "plugin/", "admission/",
			"qmpinput/"},
		require: []string{"egress/labnet"},
	},
	{
		name:    "the live view's binary links no fixture",
		from:    []string{"qmpinput/cmd/tether-qmp"},
		forbid:  []string{"fixtures/"},
		require: []string{"qmpinput"},
	},
}

// TestLeavesImportOnlyLeaves: every leaf imports the standard library and
// other leaves only, for linux, darwin and windows.
func TestLeavesImportOnlyLeaves(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		args := []string{"list", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}"}
		for _, l := range leaves {
			args = append(args, mod+l)
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
				if !leafImport(imp) {
					t.Errorf("GOOS=%s: leaf %s imports %s", goos, pkg, imp)
				}
			}
		}
	}
}

// leafImport: imp is in the standard library (no dot in its first
// element) or is a leaf.
func leafImport(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".") || slices.Contains(leaves, strings.TrimPrefix(imp, mod))
}

// TestNeverLinks checks each rule against go list -deps.
func TestNeverLinks(t *testing.T) {
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			violations := checkRule(t, r)
			for _, v := range violations {
				if r.pending != "" {
					t.Logf("not enforced (%s): %s", r.pending, v)
					continue
				}
				t.Error(v)
			}
			if r.pending != "" && len(violations) == 0 {
				t.Errorf("rule holds: enforce it (remove pending %q)", r.pending)
			}
		})
	}
}

// checkRule returns the rule's violations, one line each.
func checkRule(t *testing.T, r rule) []string {
	t.Helper()
	var bad []string
	for _, from := range r.from {
		out, err := exec.Command("go", "list", "-deps", mod+from).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", from, err)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			if forbidden(strings.TrimPrefix(d, mod), r.forbid) {
				bad = append(bad, from+" links "+d)
			}
		}
		for _, req := range r.require {
			if !slices.Contains(deps, mod+req) {
				t.Errorf("%s does not list %s: is the listing complete?", from, req)
			}
		}
	}
	return bad
}

func forbidden(d string, forbid []string) bool {
	for _, f := range forbid {
		if d == strings.TrimSuffix(f, "/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(d, f)) ||
			strings.HasPrefix(d, f+"/") {
			return true
		}
	}
	return false
}

// TestRulesSeeALink is the positive control: the receiver does link the
// wire server and acperr does import the ACP SDK, so a rule forbidding
// either must report it, and a leaf list holding acperr must fail.
func TestRulesSeeALink(t *testing.T) {
	bad := checkRule(t, rule{from: []string{"receiver/cmd/tether-receiver"}, forbid: []string{"receiver/wireserver"},
		require: []string{"receiver/wire"}})
	if len(bad) == 0 {
		t.Error("a rule forbidding the wire server passes on the receiver, which links it")
	}
	if leafImport("github.com/coder/acp-go-sdk") || leafImport(mod+"admission/acperr") {
		t.Error("leafImport accepts a module outside the standard library and the leaves")
	}
	if !leafImport("encoding/json") || !leafImport(mod+"admission/errcode") {
		t.Error("leafImport refuses the standard library or a leaf")
	}
}
