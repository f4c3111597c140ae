package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// destroyProv is a provisioner whose only expected call is Destroy: it
// records each, removes the directory, and fails for the directories in
// stuck (removing nothing), as a VM whose cgroup stays busy would. Any
// other call fails the test.
type destroyProv struct {
	t     *testing.T
	name  string
	mu    *sync.Mutex
	calls *[]string
	stuck map[string]bool
}

func (p destroyProv) Prepare(context.Context, string, api.Limits) (api.Machine, error) {
	p.t.Error("Prepare called while destroying leftovers")
	return nil, errors.New("unexpected")
}

func (p destroyProv) Adopt(context.Context, string) (api.Machine, error) {
	p.t.Error("Adopt called while destroying leftovers")
	return nil, errors.New("unexpected")
}

func (p destroyProv) Destroy(_ context.Context, dir string) error {
	p.mu.Lock()
	*p.calls = append(*p.calls, p.name+" "+filepath.Base(filepath.Dir(dir))+"/"+filepath.Base(dir))
	p.mu.Unlock()
	if p.stuck[filepath.Base(dir)] {
		return errors.New("cgroup tether-vm-x stays busy")
	}
	return os.RemoveAll(dir)
}

// TestDestroyLeft: every machine directory a closed daemon left is
// destroyed by its tier's provisioner (a VM computer's by the VM one, a
// local computer's, an unknown one's and a pool machine's by the
// default one), and one that cannot be destroyed is named in the error
// while the others are still destroyed. The control: a state directory
// with no machine directories gives no call and no error.
func TestDestroyLeft(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	stuck := map[string]bool{"c-vm-stuck": true}
	local := destroyProv{t: t, name: "local", mu: &mu, calls: &calls, stuck: stuck}
	vmp := destroyProv{t: t, name: "vm", mu: &mu, calls: &calls, stuck: stuck}
	provFor := func(tier string) api.Provisioner {
		if tier == api.TierVM {
			return vmp
		}
		return local
	}
	empty := t.TempDir()
	if errs := destroyLeft(context.Background(), empty, nil, provFor); len(errs) != 0 || len(calls) != 0 {
		t.Fatalf("no machines: errors %v, calls %v", errs, calls)
	}
	dir := t.TempDir()
	for _, d := range []string{"computers/c-vm", "computers/c-vm-stuck", "computers/c-local", "computers/c-unknown", "pool/default-1"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	tiers := map[string]string{"c-vm": api.TierVM, "c-vm-stuck": api.TierVM, "c-local": api.TierNamespaced}
	errs := destroyLeft(context.Background(), dir, tiers, provFor)
	slices.Sort(calls)
	want := []string{"local computers/c-local", "local computers/c-unknown", "local pool/default-1", "vm computers/c-vm", "vm computers/c-vm-stuck"}
	if !slices.Equal(calls, want) {
		t.Fatalf("Destroy calls %v, want %v", calls, want)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), filepath.Join(dir, "computers", "c-vm-stuck")) ||
		!strings.Contains(errs[0].Error(), "stays busy") {
		t.Fatalf("errors %v, want one naming c-vm-stuck and why", errs)
	}
	left, _ := os.ReadDir(filepath.Join(dir, "computers"))
	if len(left) != 1 || left[0].Name() != "c-vm-stuck" {
		t.Fatalf("left %v, want only the stuck one", left)
	}
}
