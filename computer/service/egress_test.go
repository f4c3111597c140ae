package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// fakeEgress is the test's api.Egress. It fails the test on any call the
// service should never make (Attach of an id twice, SetPolicy of an id
// not attached, a nil listener), records each call in the provisioner's
// call list as "Op id", and keeps each id's policy and refused callback.
type fakeEgress struct {
	t      *testing.T
	prov   *strictProv
	mu     sync.Mutex
	pols   map[string]policy.Policy
	lns    map[string]net.Listener
	refuse map[string]func(policy.Refusal)
	setErr error
}

var _ api.Egress = (*fakeEgress)(nil)

func newFakeEgress(t *testing.T, prov *strictProv) *fakeEgress {
	return &fakeEgress{t: t, prov: prov, pols: map[string]policy.Policy{}, lns: map[string]net.Listener{},
		refuse: map[string]func(policy.Refusal){}}
}

func (e *fakeEgress) Attach(ctx context.Context, id string, pol policy.Policy, ln net.Listener, refused func(policy.Refusal)) error {
	e.prov.record("Attach", id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.pols[id]; ok {
		e.t.Errorf("Attach %s twice", id)
		return errors.New("attached twice")
	}
	if ln == nil || refused == nil {
		e.t.Errorf("Attach %s: listener %v, refused set %v", id, ln, refused != nil)
	}
	e.pols[id], e.lns[id], e.refuse[id] = pol, ln, refused
	return nil
}

func (e *fakeEgress) SetPolicy(ctx context.Context, id string, pol policy.Policy) error {
	e.prov.record("SetPolicy", id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.pols[id]; !ok {
		e.t.Errorf("SetPolicy %s: not attached", id)
		return errors.New("unknown id")
	}
	if e.setErr != nil {
		return e.setErr
	}
	e.pols[id] = pol
	return nil
}

func (e *fakeEgress) Detach(ctx context.Context, id string) error {
	e.prov.record("Detach", id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if ln := e.lns[id]; ln != nil {
		ln.Close()
	}
	delete(e.pols, id)
	delete(e.lns, id)
	delete(e.refuse, id)
	return nil
}

func (e *fakeEgress) policyOf(id string) (policy.Policy, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.pols[id]
	return p, ok
}

// netMachine is a strictMachine that is networked: its listener is on the
// host's loopback (the test needs only a listener), and what it is told
// is recorded.
type netMachine struct {
	*strictMachine
	mu       *sync.Mutex
	refusals *[]policy.Refusal
}

func (m netMachine) EgressListener(ctx context.Context, port int) (net.Listener, error) {
	m.use("EgressListener")
	if port != api.EgressPort {
		m.p.t.Errorf("EgressListener port %d, want %d", port, api.EgressPort)
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

func (m netMachine) UseEgressProxy(on bool) {
	if on {
		m.use("UseEgressProxy")
	}
}

func (m netMachine) RecordRefusal(r policy.Refusal) error {
	m.use("RecordRefusal")
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.refusals = append(*m.refusals, r)
	return nil
}

func (m netMachine) RefusalLog() string { return "/run/tether/egress-refused.log" }

// egressService is a service with a fake proxy and networked machines;
// refusals collects what the machines were asked to show.
func egressService(t *testing.T, dir string, prov *strictProv) (*Service, *fakeEgress, *[]policy.Refusal) {
	var mu sync.Mutex
	var refusals []policy.Refusal
	prov.wrap = func(m *strictMachine) api.Machine { return netMachine{m, &mu, &refusals} }
	eg := newFakeEgress(t, prov)
	s := open(t, dir, prov, Config{Egress: eg, EgressPresets: []string{"pypi"}})
	return s, eg, &refusals
}

var pypi = policy.Policy{Allow: []policy.Rule{{Host: "pypi.org"}, {Host: "*.pythonhosted.org"}}}

// before reports whether a precedes b in calls (both present).
func before(calls []string, a, b string) bool {
	i, j := slices.Index(calls, a), slices.Index(calls, b)
	return i >= 0 && j >= 0 && i < j
}

// TestEgressAttachedWhileRunning: a computer created with a policy is
// attached under it (its grant's environment pointed at the proxy)
// before its grant, and detached before its teardown withdraws the
// grant; a refusal reaches the machine.
func TestEgressAttachedWhileRunning(t *testing.T) {
	prov := newStrictProv(t)
	s, eg, refusals := egressService(t, t.TempDir(), prov)
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{Egress: pypi})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.cfg.Dir, "computers", c.ID)
	if pol, ok := eg.policyOf(c.ID); !ok || !reflect.DeepEqual(pol, pypi) {
		t.Fatalf("attached %v under %+v, want %+v", ok, pol, pypi)
	}
	calls := prov.allCalls()
	if !before(calls, "UseEgressProxy "+dir, "Grant "+dir) || !before(calls, "Attach "+c.ID, "Grant "+dir) {
		t.Fatalf("calls %v: want the proxy environment and Attach before Grant", calls)
	}
	eg.mu.Lock()
	refused := eg.refuse[c.ID]
	eg.mu.Unlock()
	r := policy.Refusal{Host: "evil.example", Port: 443, Check: policy.CheckPolicy, Reason: "no allow rule matches"}
	refused(r)
	if len(*refusals) != 1 || (*refusals)[0] != r {
		t.Fatalf("the machine was shown %v, want %v", *refusals, r)
	}
	info, err := s.Egress(ctx, alice, c.ID)
	if err != nil || !info.Enabled || !info.Attached || info.RefusalLog == "" || !reflect.DeepEqual(info.Policy, pypi) {
		t.Fatalf("Egress = %+v, %v", info, err)
	}
	if ids := s.EgressAttached(); !slices.Equal(ids, []string{c.ID}) {
		t.Fatalf("EgressAttached = %v", ids)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	calls = prov.allCalls()
	if !before(calls, "Detach "+c.ID, "Withdraw "+dir) {
		t.Fatalf("calls %v: want Detach before Withdraw", calls)
	}
	if _, ok := eg.policyOf(c.ID); ok {
		t.Fatal("still attached after delete")
	}
	if info, _ := s.Egress(ctx, alice, c.ID); info.Attached || len(s.EgressAttached()) != 0 {
		t.Fatalf("after delete: %+v, attached %v", info, s.EgressAttached())
	}
}

// TestSetEgress: the policy of a running computer changes in the record
// and the proxy; a malformed policy, an unknown preset, another owner
// and an ended computer are refused with their codes and change nothing.
func TestSetEgress(t *testing.T) {
	prov := newStrictProv(t)
	s, eg, _ := egressService(t, t.TempDir(), prov)
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if pol, ok := eg.policyOf(c.ID); !ok || !reflect.DeepEqual(pol, policy.Policy{}) {
		t.Fatalf("default: attached %v under %+v, want deny all", ok, pol)
	}
	want := policy.Policy{Allow: []policy.Rule{{Host: "github.com", Ports: []uint16{443}}}, Presets: []string{"pypi"}}
	info, err := s.SetEgress(ctx, alice, c.ID, want)
	if err != nil || !reflect.DeepEqual(info.Policy, want) {
		t.Fatalf("SetEgress = %+v, %v", info, err)
	}
	if pol, _ := eg.policyOf(c.ID); !reflect.DeepEqual(pol, want) {
		t.Fatalf("the proxy holds %+v", pol)
	}
	_, err = s.SetEgress(ctx, alice, c.ID, policy.Policy{Presets: []string{"nonesuch"}})
	wantCode(t, err, api.CodeUnknownPreset)
	_, err = s.SetEgress(ctx, alice, c.ID, policy.Policy{Allow: []policy.Rule{{Host: "127.0.0.1"}}})
	wantCode(t, err, api.CodeBadRequest)
	_, err = s.SetEgress(ctx, bob, c.ID, policy.Policy{})
	wantCode(t, err, api.CodeNotFound)
	_, err = s.Egress(ctx, bob, c.ID)
	wantCode(t, err, api.CodeNotFound)
	eg.setErr = errors.New("proxy says no")
	_, err = s.SetEgress(ctx, alice, c.ID, policy.Policy{})
	wantCode(t, err, api.CodeInternal)
	eg.setErr = nil
	if info, _ := s.Egress(ctx, alice, c.ID); !reflect.DeepEqual(info.Policy, want) {
		t.Fatalf("after refusals the record holds %+v, want %+v", info.Policy, want)
	}
	if n := prov.count("SetPolicy"); n != 2 {
		t.Fatalf("SetPolicy called %d times, want 2 (the change and the one the proxy refused)", n)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.SetEgress(ctx, alice, c.ID, policy.Policy{})
	wantCode(t, err, api.CodeConflict)
}

// TestEgressSurvivesRestart: the policy is in the store, and a daemon
// that re-adopts the computer attaches it again under it.
func TestEgressSurvivesRestart(t *testing.T) {
	prov := newStrictProv(t)
	dir := t.TempDir()
	s, _, _ := egressService(t, dir, prov)
	c, err := s.Create(context.Background(), alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetEgress(context.Background(), alice, c.ID, pypi); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, eg2, _ := egressService(t, dir, prov)
	if pol, ok := eg2.policyOf(c.ID); !ok || !reflect.DeepEqual(pol, pypi) {
		t.Fatalf("after restart: attached %v under %+v, want %+v", ok, pol, pypi)
	}
}

// TestNoEgressService: without Config.Egress a policy that allows
// anything is refused (no_egress) and nothing is made; deny all is the
// default and the machine is never asked for a listener.
func TestNoEgressService(t *testing.T) {
	s, prov := newTestService(t, Config{})
	ctx := context.Background()
	_, err := s.Create(ctx, alice, api.CreateRequest{Egress: policy.Policy{Allow: []policy.Rule{{Host: "pypi.org"}}}})
	wantCode(t, err, api.CodeNoEgress)
	if n := prov.count("Prepare"); n != 0 {
		t.Fatalf("a refused create prepared %d machines", n)
	}
	c, err := s.Create(ctx, alice, api.CreateRequest{Egress: policy.Policy{Deny: []policy.Rule{{Host: "a.example"}}}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Egress(ctx, alice, c.ID)
	if err != nil || info.Enabled || info.Attached {
		t.Fatalf("Egress = %+v, %v", info, err)
	}
	_, err = s.SetEgress(ctx, alice, c.ID, pypi)
	wantCode(t, err, api.CodeNoEgress)
	_, err = s.Create(ctx, alice, api.CreateRequest{Egress: policy.Policy{Presets: []string{"pypi"}}})
	wantCode(t, err, api.CodeUnknownPreset)
}

// failingRecorder is a machine whose refusal file cannot be written.
type failingRecorder struct{ api.Machine }

func (failingRecorder) RecordRefusal(policy.Refusal) error { return errors.New("receiver gone") }
func (failingRecorder) RefusalLog() string                 { return "/run/tether/egress-refused.log" }

// TestRefusalFailuresLogBounded: 2,500 refusals that cannot be shown are
// logged 3 times (the first, the 1000th, the 2000th), not 2,500.
func TestRefusalFailuresLogBounded(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	s, _ := newTestService(t, Config{Logf: func(format string, args ...any) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf(format, args...))
		mu.Unlock()
	}})
	refused := s.refusedFor("c-x", failingRecorder{})
	for range 2500 {
		refused(policy.Refusal{Host: "a.example", Port: 443, Check: policy.CheckPolicy})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 3 || !strings.Contains(lines[2], "(2000 so far)") {
		t.Fatalf("logged %d lines: %q", len(lines), lines)
	}
}
