package service

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/lifecycle"
)

// crash stops s the way a killed daemon stops: no provisioner call and
// no transition happens on the way down (Close makes none; this checks
// it), and the files are left as they are.
func crash(t *testing.T, s *Service, prov *strictProv) {
	t.Helper()
	n := len(prov.allCalls())
	s.Close()
	if calls := prov.allCalls()[n:]; len(calls) != 0 {
		t.Fatalf("stopping the service called the provisioner: %v", calls)
	}
}

// seed writes a record as a crashed daemon would have left it: the log
// holds the transitions through logged, the store the record.
func seed(t *testing.T, dir string, r record, logged ...string) {
	t.Helper()
	st, err := openStore(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	lg, err := lifecycle.Open(filepath.Join(dir, "transitions.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	from := lifecycle.None
	for _, to := range logged {
		if _, err := lg.Append(lifecycle.Record{Computer: r.ID, Owner: r.Owner, From: from, To: to, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		from = to
	}
	if err := st.put(r); err != nil {
		t.Fatal(err)
	}
}

func prepared(t *testing.T, prov *strictProv, dir string) {
	t.Helper()
	m, err := prov.Prepare(context.Background(), dir, api.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Grant(context.Background(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// scene is what a crashed daemon left: the ids of the computers it had
// made, and its pool's directories.
type scene struct {
	dir                 string
	prov                *strictProv
	alive, dead, frozen string
	poolDirs            []string
}

func (sc scene) cdir(id string) string { return filepath.Join(sc.dir, "computers", id) }

// crashScene runs a daemon with a pool, three computers (one suspended),
// crashes it, lets one receiver die, and seeds the records a crash can
// leave mid-way.
func crashScene(t *testing.T) scene {
	sc := scene{dir: t.TempDir(), prov: newStrictProv(t)}
	s := open(t, sc.dir, sc.prov, Config{Pools: []Profile{{Name: "small", Limits: small, Size: 1}}})
	ctx := context.Background()
	waitPool(t, s, "small", 1)
	for _, p := range []struct {
		id *string
		c  api.Caller
	}{{&sc.alive, alice}, {&sc.dead, alice}, {&sc.frozen, bob}} {
		c, err := s.Create(ctx, p.c, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		*p.id = c.ID
	}
	if _, err := s.Suspend(ctx, bob, sc.frozen); err != nil {
		t.Fatal(err)
	}
	sc.poolDirs, _ = s.st.poolDirs()
	crash(t, s, sc.prov)
	sc.prov.dead[sc.cdir(sc.dead)] = true
	seedMidway(t, sc)
	return sc
}

// seedMidway writes the records of a create that had prepared its
// machine, one that had not, an expiry whose receiver had died (logged
// only up to running: the crash came between the store and the log),
// and a queued create.
func seedMidway(t *testing.T, sc scene) {
	now := time.Now().UTC().Round(0)
	prepared(t, sc.prov, sc.cdir("c-midcreate"))
	seed(t, sc.dir, record{ID: "c-midcreate", Owner: "alice", State: api.StateCreating, Dir: sc.cdir("c-midcreate"),
		Created: now, LeaseEnd: now.Add(time.Hour)}, api.StateQueued, api.StateCreating)
	seed(t, sc.dir, record{ID: "c-noprep", Owner: "alice", State: api.StateCreating, Dir: sc.cdir("c-noprep"),
		Created: now}, api.StateQueued, api.StateCreating)
	// c-noprep's directory was never made: Adopt fails, and Destroy of
	// what is not there must succeed.
	sc.prov.machines[sc.cdir("c-noprep")] = &strictMachine{p: sc.prov, dir: sc.cdir("c-noprep")}
	sc.prov.dead[sc.cdir("c-noprep")] = true
	prepared(t, sc.prov, sc.cdir("c-midexpiry"))
	sc.prov.dead[sc.cdir("c-midexpiry")] = true
	seed(t, sc.dir, record{ID: "c-midexpiry", Owner: "bob", State: api.StateExpiring, Dir: sc.cdir("c-midexpiry"),
		Created: now, Reason: "lease expired"}, api.StateQueued, api.StateCreating, api.StateRunning)
	seed(t, sc.dir, record{ID: "c-queued", Owner: "bob", State: api.StateQueued, Created: now}, api.StateQueued)
}

// TestCrashRestart: a daemon dies with computers in every state; the
// next one re-adopts the live ones, tears down the one whose receiver
// died, finishes the creates and expiries left mid-way, drops the queued
// one, destroys the pool's leftovers, and its log still verifies.
func TestCrashRestart(t *testing.T) {
	sc := crashScene(t)
	before := len(sc.prov.allCalls())
	s2 := open(t, sc.dir, sc.prov, Config{})
	calls := sc.prov.allCalls()[before:]
	t.Logf("restart calls: %v", calls)
	checkRestart(t, s2, sc, calls, map[string]restartWant{
		sc.alive:      {api.StateRunning, []string{"Adopt", "Thaw"}},
		sc.dead:       {api.StateFailed, []string{"Adopt", "Destroy"}},
		sc.frozen:     {api.StateSuspended, []string{"Adopt", "Freeze"}},
		"c-midcreate": {api.StateFailed, []string{"Adopt", "Withdraw", "KillCommands", "Close"}},
		"c-noprep":    {api.StateFailed, []string{"Adopt", "Destroy"}},
		"c-midexpiry": {api.StateDeleted, []string{"Adopt", "Destroy"}},
		"c-queued":    {api.StateDeleted, nil},
	})
	ctx := context.Background()
	if got, _ := s2.Get(ctx, admin, sc.dead); !strings.HasPrefix(got.Reason, "receiver died") {
		t.Errorf("dead computer's reason %q", got.Reason)
	}
	for _, d := range sc.poolDirs {
		if ops := sc.prov.callsFor(d); !slices.Contains(ops, "Destroy") {
			t.Errorf("pool leftover %s not destroyed: %v", d, ops)
		}
	}
	// The live computers work on: the adopted one still ends in order.
	n := len(teardownOps(sc.prov, sc.cdir(sc.alive)))
	if err := s2.Delete(ctx, alice, sc.alive); err != nil {
		t.Fatal(err)
	}
	if ops := teardownOps(sc.prov, sc.cdir(sc.alive))[n:]; !slices.Equal(ops, []string{"Withdraw", "KillCommands", "Close"}) {
		t.Errorf("adopted computer's delete: %v", ops)
	}
	if _, err := s2.Resume(ctx, bob, sc.frozen); err != nil {
		t.Errorf("resume the re-adopted suspended computer: %v", err)
	}
	s2.Close()
	if n, err := lifecycle.Verify(filepath.Join(sc.dir, "transitions.log")); err != nil {
		t.Fatalf("log after restart: %d records, %v", n, err)
	}
}

type restartWant struct {
	state string
	ops   []string
}

// checkRestart compares each computer's state and the calls the restart
// made on its directory.
func checkRestart(t *testing.T, s *Service, sc scene, calls []string, want map[string]restartWant) {
	t.Helper()
	for id, w := range want {
		got, err := s.Get(context.Background(), admin, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if got.State != w.state {
			t.Errorf("%s: state %s (%s), want %s", id, got.State, got.Reason, w.state)
		}
		var ops []string
		for _, c := range calls {
			if op, d, _ := strings.Cut(c, " "); d == sc.cdir(id) && op != "Busy" {
				ops = append(ops, op)
			}
		}
		if !slices.Equal(ops, w.ops) {
			t.Errorf("%s: restart calls %v, want %v", id, ops, w.ops)
		}
	}
}

// TestRestartKeepsLease: a computer re-adopted after a crash still
// expires at its recorded lease end.
func TestRestartKeepsLease(t *testing.T) {
	dir := t.TempDir()
	prov := newStrictProv(t)
	s := open(t, dir, prov, Config{})
	c, err := s.Create(context.Background(), alice, api.CreateRequest{LeaseTTLSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	crash(t, s, prov)
	s2 := open(t, dir, prov, Config{})
	evs := subscribe(t, s2, alice)
	if got, _ := s2.Get(context.Background(), alice, c.ID); got.State != api.StateRunning {
		t.Fatalf("re-adopted %s", got.State)
	}
	waitFor(t, evs, 10*time.Second, to(c.ID, api.StateDeleted))
	over := time.Since(c.LeaseExpiresAt)
	t.Logf("deleted %s after the recorded lease end", over)
	if over > 2*time.Second {
		t.Fatalf("outlived its lease by %s across a restart", over)
	}
}
