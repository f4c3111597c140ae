package qmpinput

import (
	"os/exec"
	"strings"
	"testing"
)

// TestVisualPathSharesNoChainCode: no package of the visual path links
// tether's file and exec chain (custodian, receiver, plugin, admission
// beyond its signature package and the leaves strict JSON decoder,
// backoff, atomic write and the CLI convention) or the
// test fixtures, and the live view's
// packages do not link os/exec at all. It reads the real import graph
// with go list -deps.
func TestVisualPathSharesNoChainCode(t *testing.T) {
	const mod = "github.com/tetherdev/tether/"
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	noExec := map[string]bool{mod + "qmpinput/rfb": true, mod + "qmpinput/token": true,
		mod + "qmpinput/auditlog": true, mod + "qmpinput/view": true}
	checked := 0
	for _, pkg := range strings.Fields(string(out)) {
		deps, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, d := range strings.Fields(string(deps)) {
			if chainPackage(mod, d) {
				t.Errorf("%s links %s", pkg, d)
			}
			if noExec[pkg] && d == "os/exec" {
				t.Errorf("%s links os/exec", pkg)
			}
		}
		checked++
	}
	if checked < 5 || !strings.Contains(string(out), mod+"qmpinput/rfb") {
		t.Fatalf("checked %d packages: %s", checked, out)
	}
}

func chainPackage(mod, d string) bool {
	rest, ok := strings.CutPrefix(d, mod)
	if !ok || strings.HasPrefix(rest, "qmpinput") || rest == "admission/signing" || rest == "admission/strictjson" ||
		rest == "admission/backoff" || rest == "admission/atomicfile" || rest == "admission/cli" {
		return false
	}
	return true
}
