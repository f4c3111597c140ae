package service

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/lifecycle"
)

var (
	alice = api.Caller{Owner: "alice"}
	bob   = api.Caller{Owner: "bob"}
	admin = api.Caller{Owner: "ops", Admin: true}
)

// open starts a Service on dir with prov and cfg's other fields.
func open(t *testing.T, dir string, prov *strictProv, cfg Config) *Service {
	t.Helper()
	cfg.Dir, cfg.Provisioner = dir, prov
	if cfg.IdleCheck == 0 {
		cfg.IdleCheck = 20 * time.Millisecond
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newTestService(t *testing.T, cfg Config) (*Service, *strictProv) {
	t.Helper()
	prov := newStrictProv(t)
	return open(t, t.TempDir(), prov, cfg), prov
}

func subscribe(t *testing.T, s *Service, c api.Caller) <-chan api.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := s.Events(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// waitFor reads ch until an event matches, failing after timeout.
func waitFor(t *testing.T, ch <-chan api.Event, timeout time.Duration, match func(api.Event) bool) api.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("event stream closed")
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no matching event within %s", timeout)
		}
	}
}

func to(id, state string) func(api.Event) bool {
	return func(ev api.Event) bool { return ev.Computer == id && ev.To == state && ev.From != ev.To }
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if api.CodeOf(err) != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
}

// teardownOps are the calls of one machine without the idle reads.
func teardownOps(p *strictProv, dir string) []string {
	return slices.DeleteFunc(p.callsFor(dir), func(op string) bool { return op == "Busy" })
}

func TestCreateDeleteOrderAndEvents(t *testing.T) {
	s, prov := newTestService(t, Config{})
	evs := subscribe(t, s, admin)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{Labels: map[string]string{"job": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.State != api.StateRunning || c.Owner != "alice" || c.Tuple == nil || c.LeaseExpiresAt.IsZero() {
		t.Fatalf("created %+v", c)
	}
	if err := s.Delete(context.Background(), alice, c.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 5 {
		ev := waitFor(t, evs, 5*time.Second, func(ev api.Event) bool { return ev.Computer == c.ID && ev.From != ev.To })
		got = append(got, ev.From+">"+ev.To)
	}
	want := []string{">queued", "queued>creating", "creating>running", "running>expiring", "expiring>deleted"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", c.ID)
	if ops := teardownOps(prov, dir); !slices.Equal(ops, []string{"Prepare", "Grant", "Withdraw", "KillCommands", "Close"}) {
		t.Fatalf("calls on %s: %v", dir, ops)
	}
	if n, err := lifecycle.Verify(filepath.Join(s.cfg.Dir, "transitions.log")); err != nil || n != 5 {
		t.Fatalf("log Verify = %d, %v", n, err)
	}
	got2, _ := s.Get(context.Background(), alice, c.ID)
	if got2.State != api.StateDeleted {
		t.Fatalf("after delete: %s", got2.State)
	}
}

// TestOtherOwnerSeesNotFound: bob cannot see, renew, suspend or delete
// alice's computer; each try answers not_found and is reported; an admin
// can (the positive control: the computer is there).
func TestOtherOwnerSeesNotFound(t *testing.T) {
	var mu sync.Mutex
	var denied []string
	s, _ := newTestService(t, Config{OnDenied: func(c api.Caller, id string) {
		mu.Lock()
		denied = append(denied, c.Owner+":"+id)
		mu.Unlock()
	}})
	bobEvents := subscribe(t, s, bob)
	adminEvents := subscribe(t, s, admin)
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	_, err = s.Renew(ctx, bob, c.ID, time.Minute)
	wantCode(t, err, api.CodeNotFound)
	_, err = s.Suspend(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	wantCode(t, s.Delete(ctx, bob, c.ID), api.CodeNotFound)
	_, err = s.Get(ctx, bob, "c-nonexistent")
	wantCode(t, err, api.CodeNotFound)
	if l, _ := s.List(ctx, bob); len(l) != 0 {
		t.Fatalf("bob lists %v", l)
	}
	mu.Lock()
	if len(denied) != 4 || denied[0] != "bob:"+c.ID {
		t.Fatalf("denied attempts reported: %v, want 4 of bob on %s", denied, c.ID)
	}
	mu.Unlock()
	if got, err := s.Get(ctx, admin, c.ID); err != nil || got.ID != c.ID {
		t.Fatalf("admin Get: %v", err)
	}
	if l, _ := s.List(ctx, admin); len(l) != 1 {
		t.Fatalf("admin lists %d", len(l))
	}
	waitFor(t, adminEvents, 5*time.Second, to(c.ID, api.StateRunning))
	select {
	case ev := <-bobEvents:
		t.Fatalf("bob saw alice's event %+v", ev)
	default:
	}
}

func TestBadRequestsCreateNothing(t *testing.T) {
	s, prov := newTestService(t, Config{MaxLeaseTTL: time.Hour, MaxLimits: api.Limits{MemoryBytes: 1 << 30},
		MaxMemoryBytes: 2 << 30})
	bad := map[string]api.CreateRequest{
		"ttl over max":     {LeaseTTLSeconds: 3601},
		"ttl negative":     {LeaseTTLSeconds: -1},
		"memory negative":  {Limits: api.Limits{MemoryBytes: -1}},
		"memory over max":  {Limits: api.Limits{MemoryBytes: 1<<30 + 1}},
		"pids negative":    {Limits: api.Limits{Pids: -5}},
		"idle negative":    {IdleTimeoutSeconds: -1},
		"queue negative":   {QueueTimeoutSeconds: -1},
		"huge ttl":         {LeaseTTLSeconds: 1 << 62},
		"label with NUL":   {Labels: map[string]string{"a": "b\x00"}},
		"label key empty":  {Labels: map[string]string{"": "b"}},
		"label value long": {Labels: map[string]string{"a": strings.Repeat("x", 256)}},
	}
	for name, req := range bad {
		_, err := s.Create(context.Background(), alice, req)
		if api.CodeOf(err) != api.CodeBadRequest {
			t.Errorf("%s: %v, want bad_request", name, err)
		}
	}
	// With no ceilings configured, the defaults still refuse huge limits.
	d, _ := newTestService(t, Config{})
	for _, l := range []api.Limits{{MemoryBytes: 1 << 62}, {Pids: 1 << 40}, {DiskBytes: 1 << 62}} {
		_, err := d.Create(context.Background(), alice, api.CreateRequest{Limits: l})
		if api.CodeOf(err) != api.CodeBadRequest {
			t.Errorf("%+v with default ceilings: %v, want bad_request", l, err)
		}
	}
	if calls := prov.allCalls(); len(calls) != 0 {
		t.Fatalf("refused creates called the provisioner: %v", calls)
	}
	if l, _ := s.List(context.Background(), admin); len(l) != 0 {
		t.Fatalf("refused creates left records: %v", l)
	}
	// Positive control: the largest allowed request is made.
	if _, err := s.Create(context.Background(), alice, api.CreateRequest{LeaseTTLSeconds: 3600,
		Limits: api.Limits{MemoryBytes: 1 << 30}}); err != nil {
		t.Fatalf("allowed request refused: %v", err)
	}
}

// TestLeaseExpiryOrderAndBound: a 1 s lease ends with Withdraw, then
// KillCommands, then Close, and the computer is deleted within 2 s of
// its lease end (monotonic clock).
func TestLeaseExpiryOrderAndBound(t *testing.T) {
	s, prov := newTestService(t, Config{})
	evs := subscribe(t, s, alice)
	before := time.Now()
	c, err := s.Create(context.Background(), alice, api.CreateRequest{LeaseTTLSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, evs, 10*time.Second, to(c.ID, api.StateDeleted))
	// The lease started after before, so this bounds the overrun from
	// above.
	over := time.Since(before) - time.Second
	t.Logf("deleted %s after the lease end (at most)", over)
	if over > 2*time.Second {
		t.Fatalf("outlived its lease by %s", over)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", c.ID)
	if ops := teardownOps(prov, dir); !slices.Equal(ops, []string{"Prepare", "Grant", "Withdraw", "KillCommands", "Close"}) {
		t.Fatalf("calls: %v, want Prepare Grant Withdraw KillCommands Close", ops)
	}
	m := prov.machines[dir]
	if !m.grants[0].Equal(c.LeaseExpiresAt) {
		t.Fatalf("grant not_after %s, lease end %s", m.grants[0], c.LeaseExpiresAt)
	}
	got, _ := s.Get(context.Background(), alice, c.ID)
	if got.State != api.StateDeleted || got.Reason != "lease expired" {
		t.Fatalf("after expiry: %s %q", got.State, got.Reason)
	}
}

func TestRenew(t *testing.T) {
	s, prov := newTestService(t, Config{MaxLeaseTTL: time.Hour})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{LeaseTTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Renew(ctx, alice, c.ID, time.Hour+time.Second)
	wantCode(t, err, api.CodeBadRequest)
	r, err := s.Renew(ctx, alice, c.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !r.LeaseExpiresAt.After(c.LeaseExpiresAt) {
		t.Fatalf("renew did not move the lease: %s → %s", c.LeaseExpiresAt, r.LeaseExpiresAt)
	}
	m := prov.machines[filepath.Join(s.cfg.Dir, "computers", c.ID)]
	prov.mu.Lock()
	n, last := len(m.grants), m.grants[len(m.grants)-1]
	prov.mu.Unlock()
	if n != 2 || !last.Equal(r.LeaseExpiresAt) {
		t.Fatalf("grants %d, last %s, want 2 ending %s", n, last, r.LeaseExpiresAt)
	}
}

// TestIdleSuspendAndResume: a busy computer stays running past its idle
// timeout (the control), an idle one is frozen, and Touch thaws it.
func TestIdleSuspendAndResume(t *testing.T) {
	s, prov := newTestService(t, Config{})
	evs := subscribe(t, s, alice)
	prov.busy.Store(true)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{IdleTimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", c.ID)
	// Busy for twice the idle timeout: still running.
	busyUntil := time.Now().Add(2 * time.Second)
	for time.Now().Before(busyUntil) {
		waitCalls(t, prov, "Busy", prov.count("Busy")+1)
	}
	if got, _ := s.Get(context.Background(), alice, c.ID); got.State != api.StateRunning {
		t.Fatalf("busy computer is %s", got.State)
	}
	prov.busy.Store(false)
	start := time.Now()
	ev := waitFor(t, evs, 5*time.Second, to(c.ID, api.StateSuspended))
	t.Logf("suspended %s after it went idle", time.Since(start))
	// The last busy reading came at most one IdleCheck before start.
	if ev.Reason != "idle" || time.Since(start) < time.Second-2*s.cfg.IdleCheck {
		t.Fatalf("suspended after %s, reason %q", time.Since(start), ev.Reason)
	}
	if err := s.Touch(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, evs, 5*time.Second, to(c.ID, api.StateRunning))
	ops := teardownOps(prov, dir)
	if !slices.Equal(ops[len(ops)-2:], []string{"Freeze", "Thaw"}) {
		t.Fatalf("calls: %v, want Freeze then Thaw last", ops)
	}
}

func waitCalls(t *testing.T, p *strictProv, op string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.count(op) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d %s calls", n, op)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSuspendedComputerStillExpires: the lease runs while suspended.
func TestSuspendedComputerStillExpires(t *testing.T) {
	s, prov := newTestService(t, Config{})
	evs := subscribe(t, s, alice)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{LeaseTTLSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Suspend(context.Background(), alice, c.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, evs, 10*time.Second, to(c.ID, api.StateDeleted))
	ops := teardownOps(prov, filepath.Join(s.cfg.Dir, "computers", c.ID))
	if !slices.Equal(ops, []string{"Prepare", "Grant", "Freeze", "Withdraw", "KillCommands", "Close"}) {
		t.Fatalf("calls: %v", ops)
	}
	_, err = s.Resume(context.Background(), alice, c.ID)
	wantCode(t, err, api.CodeConflict)
}

func TestOwnerQuota(t *testing.T) {
	s, _ := newTestService(t, Config{OwnerQuota: 1})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Create(ctx, alice, api.CreateRequest{})
	wantCode(t, err, api.CodeOverQuota)
	if _, err := s.Create(ctx, bob, api.CreateRequest{}); err != nil {
		t.Fatalf("bob refused for alice's quota: %v", err)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, alice, api.CreateRequest{}); err != nil {
		t.Fatalf("quota not given back: %v", err)
	}
}

// TestReceiverDeathEndsComputer: a running computer whose receiver dies
// is ended in the expiry order and recorded failed.
func TestReceiverDeathEndsComputer(t *testing.T) {
	s, prov := newTestService(t, Config{})
	evs := subscribe(t, s, alice)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", c.ID)
	prov.mu.Lock()
	prov.dead[dir] = true
	prov.mu.Unlock()
	ev := waitFor(t, evs, 5*time.Second, to(c.ID, api.StateFailed))
	if ev.Reason != "receiver died" {
		t.Fatalf("reason %q", ev.Reason)
	}
	if ops := teardownOps(prov, dir); !slices.Equal(ops, []string{"Prepare", "Grant", "Withdraw", "KillCommands", "Close"}) {
		t.Fatalf("calls %v", ops)
	}
}
