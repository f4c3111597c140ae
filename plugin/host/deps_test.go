package host_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// unlinked are the packages (a path, or a path ending in "/" for a whole
// tree) that the plugin binary and the host library must not link: the
// receiver and the custodian (the wire server among them), the admission
// file's machinery and signatures, fsnotify, and the stores of the other
// rooms. The shared contract they need is in leaf packages (admission,
// admission/errcode, admission/acpmeta, admission/strictjson).
var unlinked = []string{
	"github.com/tetherdev/tether/receiver/",
	"github.com/tetherdev/tether/custodian/",
	"github.com/tetherdev/tether/admission/signedfile",
	"github.com/tetherdev/tether/admission/signing",
	"github.com/tetherdev/tether/admission/coordinator",
	"github.com/fsnotify/fsnotify",
	"github.com/secure-systems-lab/go-securesystemslib/dsse",
	"go.etcd.io/bbolt",
	"go.etcd.io/etcd/",
}

// hostUnlinked are the plugin's own implementation packages: the host
// library speaks to the plugin through plugin/contract only, so it links
// neither the binding table nor the plugin's server.
var hostUnlinked = []string{
	"github.com/tetherdev/tether/plugin/binding",
	"github.com/tetherdev/tether/plugin/server",
}

// TestPluginLinksOnlyTheContract reads the real import graph of
// tether-plugin and plugin/host with go list -deps and fails on any package
// of unlinked (for plugin/host, of hostUnlinked too). It also requires the
// leaf contract packages and plugin/contract in the graph, so an empty or
// failed listing cannot pass. plugin/contract's own
// TestContractLinksNoImplementation checks that the contract links no
// implementation.
func TestPluginLinksOnlyTheContract(t *testing.T) {
	for pkg, extra := range map[string][]string{"../cmd/tether-plugin": nil, ".": hostUnlinked} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			if forbiddenDep(d, unlinked) || forbiddenDep(d, extra) {
				t.Errorf("%s links %s", pkg, d)
			}
		}
		for _, leaf := range []string{"github.com/tetherdev/tether/admission/errcode", "github.com/tetherdev/tether/admission/acpmeta", "github.com/tetherdev/tether/plugin/contract"} {
			if !slices.Contains(deps, leaf) {
				t.Errorf("%s does not list %s: is the listing complete?", pkg, leaf)
			}
		}
		t.Logf("%s links %d packages", pkg, len(deps))
	}
}

// TestHostUnlinkedIsChecked is the positive control: forbiddenDep refuses
// the plugin's server and binding table for the host library.
func TestHostUnlinkedIsChecked(t *testing.T) {
	for _, d := range []string{"github.com/tetherdev/tether/plugin/binding", "github.com/tetherdev/tether/plugin/server"} {
		if !forbiddenDep(d, hostUnlinked) {
			t.Errorf("forbiddenDep allows %s to the host library", d)
		}
	}
	if forbiddenDep("github.com/tetherdev/tether/plugin/contract", hostUnlinked) {
		t.Error("forbiddenDep refuses plugin/contract to the host library")
	}
}

func forbiddenDep(d string, list []string) bool {
	for _, u := range list {
		if d == strings.TrimSuffix(u, "/") || strings.HasPrefix(d, u) || (!strings.HasSuffix(u, "/") && strings.HasPrefix(d, u+"/")) {
			return true
		}
	}
	return false
}
