package service

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// attendedMachine is a machine a person can take over (api.Attended),
// standing in for a VM's live view: while held, AttendedAt reads the
// clock; after release it stays at the moment of the release.
type attendedMachine struct {
	api.Machine
	mu    sync.Mutex
	held  bool
	last  time.Time
	reads int
}

var _ api.Attended = (*attendedMachine)(nil)

func (m *attendedMachine) AttendedAt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	if m.held {
		return time.Now()
	}
	return m.last
}

// setHeld begins (true) or ends (false) a take-over.
func (m *attendedMachine) setHeld(held bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held && !held {
		m.last = time.Now()
	}
	m.held = held
}

func (m *attendedMachine) readCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reads
}

// attendedProv makes prov hand out attendedMachines, by directory.
func attendedProv(prov *strictProv) func(dir string) *attendedMachine {
	var mu sync.Mutex
	made := map[string]*attendedMachine{}
	prov.wrap = func(m *strictMachine) api.Machine {
		mu.Lock()
		defer mu.Unlock()
		if made[m.dir] == nil {
			made[m.dir] = &attendedMachine{Machine: m}
		}
		return made[m.dir]
	}
	return func(dir string) *attendedMachine {
		mu.Lock()
		defer mu.Unlock()
		return made[dir]
	}
}

// TestIdleSparesATakeOver: a computer whose screen a person has taken
// over is not suspended while the take-over lasts, for twice its idle
// timeout with no command and no callback; once the person hands back,
// it is suspended one idle timeout later. Positive control: a computer
// of the same kind that nobody took over is suspended by the same
// service after its idle timeout.
func TestIdleSparesATakeOver(t *testing.T) {
	prov := newStrictProv(t)
	machineIn := attendedProv(prov)
	s := open(t, t.TempDir(), prov, Config{})
	evs := subscribe(t, s, alice)
	ctx := context.Background()
	taken, err := s.Create(ctx, alice, api.CreateRequest{IdleTimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	takenDir := filepath.Join(s.cfg.Dir, "computers", taken.ID)
	person := machineIn(takenDir)
	person.setHeld(true)
	alone, err := s.Create(ctx, alice, api.CreateRequest{IdleTimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	heldFrom := time.Now()
	if ev := waitFor(t, evs, 5*time.Second, to(alone.ID, api.StateSuspended)); ev.Reason != "idle" {
		t.Fatalf("the computer nobody took over was suspended for %q, want idle", ev.Reason)
	}
	// Held for twice the idle timeout, read all along: still running.
	for time.Since(heldFrom) < 2*time.Second {
		if got, _ := s.Get(ctx, alice, taken.ID); got.State != api.StateRunning {
			t.Fatalf("the computer under a take-over is %s after %s", got.State, time.Since(heldFrom))
		}
		n := person.readCount()
		waitUntil(t, "another read of the take-over", func() bool { return person.readCount() > n })
	}
	if ops := teardownOps(prov, takenDir); slices.Contains(ops, "Freeze") {
		t.Fatalf("the computer under a take-over was frozen: %v", ops)
	}
	person.setHeld(false)
	released := time.Now()
	ev := waitFor(t, evs, 5*time.Second, to(taken.ID, api.StateSuspended))
	after := time.Since(released)
	t.Logf("suspended %s after the hand back", after)
	if ev.Reason != "idle" || after < time.Second-2*s.cfg.IdleCheck {
		t.Fatalf("suspended %s after the hand back for %q, want idle after 1 s", after, ev.Reason)
	}
}

// waitUntil polls cond until it holds, failing after 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
