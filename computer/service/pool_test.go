package service

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

var small = api.Limits{MemoryBytes: 64 << 20, Pids: 64}

func waitPool(t *testing.T, s *Service, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.PoolReady()[name] != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool %s has %d ready, want %d", name, s.PoolReady()[name], n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWarmPoolClaim: a create with a profile's limits claims a pooled
// machine and grants it; the pool refills with a new machine; the
// claimed machine is closed at delete and never granted again.
func TestWarmPoolClaim(t *testing.T) {
	s, prov := newTestService(t, Config{Pools: []Profile{{Name: "small", Limits: small, Size: 1}}})
	ctx := context.Background()
	waitPool(t, s, "small", 1)
	c, err := s.Create(ctx, alice, api.CreateRequest{Limits: small})
	if err != nil {
		t.Fatal(err)
	}
	if !c.FromPool {
		t.Fatal("not from the pool")
	}
	waitPool(t, s, "small", 1)
	var dirs []string
	for _, call := range prov.allCalls() {
		if op, dir, _ := strings.Cut(call, " "); op == "Prepare" {
			dirs = append(dirs, dir)
		}
	}
	if len(dirs) != 2 || dirs[0] == dirs[1] {
		t.Fatalf("Prepare calls %v, want two pool machines", dirs)
	}
	claimed := dirs[0]
	if filepath.Dir(claimed) != filepath.Join(s.cfg.Dir, "pool") {
		t.Fatalf("claimed machine in %s", claimed)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if ops := teardownOps(prov, claimed); !slices.Equal(ops, []string{"Prepare", "Grant", "Withdraw", "KillCommands", "Close"}) {
		t.Fatalf("claimed machine's calls %v", ops)
	}
	// A second claim takes the other machine, never the released one.
	c2, err := s.Create(ctx, alice, api.CreateRequest{Limits: small})
	if err != nil || !c2.FromPool {
		t.Fatalf("second claim: %+v %v", c2, err)
	}
	if ops := teardownOps(prov, dirs[1]); !slices.Equal(ops, []string{"Prepare", "Grant"}) {
		t.Fatalf("second machine's calls %v", ops)
	}
	// Other limits are prepared fresh.
	c3, err := s.Create(ctx, bob, api.CreateRequest{Limits: api.Limits{MemoryBytes: 128 << 20}})
	if err != nil || c3.FromPool {
		t.Fatalf("non-profile create: %+v %v", c3, err)
	}
}

// TestPoolCountsTowardCapacity: with room for one computer a ready pool
// machine holds the slot; a create of another profile evicts it (Close)
// rather than wait, and the pool does not refill over capacity.
func TestPoolCountsTowardCapacity(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 1, Pools: []Profile{{Name: "small", Limits: small, Size: 1}}})
	waitPool(t, s, "small", 1)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{QueueTimeoutSeconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	if c.FromPool {
		t.Fatal("claimed a machine of another profile")
	}
	waitCalls(t, prov, "Close", 1)
	if n := prov.count("Prepare"); n != 2 {
		t.Fatalf("%d Prepare calls, want 2 (pool, then the create)", n)
	}
	s.mu.Lock()
	used := s.used
	s.mu.Unlock()
	if used != 1 {
		t.Fatalf("capacity used %d, want 1", used)
	}
}
