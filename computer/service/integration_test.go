package service

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/provision"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/testenv"
)

func TestMain(m *testing.M) { bins.TestMain(m) }

// TestIntegrationServiceRealProvisioner runs the service over the real
// namespaced provisioner: a create claims a warm pool machine, its 2 s
// lease ends it (withdraw, kill, teardown) within 2 s and nothing of it
// is left; a cold create survives a daemon crash (re-adopted) and is
// deleted after it; a last start destroys the pool machine left behind.
func TestIntegrationServiceRealProvisioner(t *testing.T) {
	testenv.Require(t, "root", "cgroup-limits", "loop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set, err := bins.Build(ctx, bins.Receiver)
	if err != nil {
		t.Fatal(err)
	}
	prov := provision.NewProvisioner(provision.Config{Bins: set})
	dir := t.TempDir()
	// The provisioner wants every parent of a computer traversable.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	profile := api.Limits{DiskBytes: 64 << 20}
	cfg := Config{Dir: dir, Provisioner: prov, Pools: []Profile{{Name: "small", Limits: profile, Size: 1}}}
	s := openReal(t, cfg)
	waitPool(t, s, "small", 1)
	evs := subscribe(t, s, alice)
	before := time.Now()
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: profile, LeaseTTLSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create from the pool took %s", time.Since(before))
	if !c.FromPool || c.CustodianConfig == "" {
		t.Fatalf("created %+v", c)
	}
	if _, err := os.Stat(c.CustodianConfig); err != nil {
		t.Fatalf("no custodian configuration while running: %v", err)
	}
	waitFor(t, evs, 30*time.Second, to(c.ID, api.StateDeleted))
	over := time.Since(before) - 2*time.Second
	t.Logf("deleted at most %s after its lease end", over)
	if over > 2*time.Second {
		t.Fatalf("outlived its lease by %s", over)
	}
	if _, err := os.Stat(c.CustodianConfig); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the expired computer's files are left: %v", err)
	}
	s = realCrashAndReadopt(t, s, cfg)
	s.Close()
	// No pool configured: the leftover pool machine is destroyed.
	s = openReal(t, Config{Dir: dir, Provisioner: prov})
	if ents, err := os.ReadDir(filepath.Join(dir, "pool")); err != nil || len(ents) != 0 {
		t.Fatalf("pool directory after the last start: %v %v", ents, err)
	}
	s.Close()
}

// realCrashAndReadopt makes a cold computer, crashes s, and checks that
// the next daemon re-adopts it, suspends and resumes it, and deletes it
// leaving none of its files. It returns the new daemon.
func realCrashAndReadopt(t *testing.T, s *Service, cfg Config) *Service {
	t.Helper()
	ctx := context.Background()
	dir, prov := cfg.Dir, cfg.Provisioner
	cold, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close() // a crash: no provisioner call, the receivers keep running
	s = openReal(t, Config{Dir: dir, Provisioner: prov})
	if got, _ := s.Get(ctx, alice, cold.ID); got.State != api.StateRunning {
		t.Fatalf("after the restart: %s (%s)", got.State, got.Reason)
	}
	if _, err := s.Suspend(ctx, alice, cold.ID); err != nil {
		t.Fatalf("suspend the re-adopted computer: %v", err)
	}
	start := time.Now()
	if _, err := s.Resume(ctx, alice, cold.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("resume took %s", time.Since(start))
	if err := s.Delete(ctx, alice, cold.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cold.CustodianConfig); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the deleted computer's files are left: %v", err)
	}
	return s
}

func openReal(t *testing.T, cfg Config) *Service {
	t.Helper()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
