package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// screenProv is a strictProv that also gives screens: PrepareScreen
// hands out a screenMachine.
type screenProv struct {
	*strictProv
	mu      sync.Mutex
	screens int
}

var _ api.ScreenProvisioner = (*screenProv)(nil)

func (p *screenProv) PrepareScreen(ctx context.Context, dir string, l api.Limits) (api.Machine, error) {
	m, err := p.Prepare(ctx, dir, l)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.screens++
	p.mu.Unlock()
	return &screenMachine{Machine: m}, nil
}

func (p *screenProv) screenCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.screens
}

// screenMachine records who each link was minted for.
type screenMachine struct {
	api.Machine
	mu     sync.Mutex
	labels []string
}

func (m *screenMachine) MintLink(_ context.Context, role string, ttl time.Duration, label string) (api.Link, error) {
	m.mu.Lock()
	m.labels = append(m.labels, label)
	m.mu.Unlock()
	return api.Link{Link: "http://127.0.0.1:1/#t=x", Role: role, ExpiresAt: time.Now().Add(ttl).UTC()}, nil
}

// TestScreenNeedsTheVMTier is the attack test of the screen's tier
// check: screen asked of the default tier, or of a VM provisioner that
// gives none, is bad_request and nothing is made. Positive control: the
// same request of a screen-giving VM provisioner makes a computer that
// says screen, through PrepareScreen.
func TestScreenNeedsTheVMTier(t *testing.T) {
	plainVM := newStrictProv(t)
	s, local := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: plainVM}})
	ctx := context.Background()
	for _, req := range []api.CreateRequest{{Screen: true}, {Tier: api.TierNamespaced, Screen: true}, {Tier: api.TierVM, Screen: true}} {
		if _, err := s.Create(ctx, alice, req); api.CodeOf(err) != api.CodeBadRequest {
			t.Fatalf("create %+v = %v, want bad_request", req, err)
		}
	}
	if local.count("Prepare") != 0 || plainVM.count("Prepare") != 0 {
		t.Fatalf("a refused screen made a machine: %v %v", local.allCalls(), plainVM.allCalls())
	}
	sp := &screenProv{strictProv: newStrictProv(t)}
	s2, _ := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: sp}})
	c, err := s2.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Screen: true})
	if err != nil || !c.Screen || sp.screenCount() != 1 {
		t.Fatalf("create with a screen: %+v %v (PrepareScreen calls %d)", c, err, sp.screenCount())
	}
	if g, err := s2.Get(ctx, alice, c.ID); err != nil || !g.Screen {
		t.Fatalf("get: %+v %v, want screen", g, err)
	}
	n, err := s2.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil || n.Screen || sp.screenCount() != 1 {
		t.Fatalf("create without a screen: %+v %v (PrepareScreen calls %d)", n, err, sp.screenCount())
	}
}

// TestLinkOwnerOnly is the attack test of link minting: another owner
// gets not_found (and nothing is minted), a computer without a screen
// or not running gets conflict, a malformed request bad_request.
// Positive control: the owner and an admin get links, each labelled
// with who asked.
func TestLinkOwnerOnly(t *testing.T) {
	sp := &screenProv{strictProv: newStrictProv(t)}
	s, _ := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: sp}})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM, Screen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, bob, c.ID, api.LinkRequest{Role: api.LinkRoleControl}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("bob's link = %v, want not_found", err)
	}
	if _, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: "owner"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("role owner = %v, want bad_request", err)
	}
	l, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: api.LinkRoleControl, TTLSeconds: 60})
	if err != nil || l.Role != api.LinkRoleControl || time.Until(l.ExpiresAt) > time.Minute {
		t.Fatalf("alice's link: %+v %v", l, err)
	}
	if _, err := s.Link(ctx, admin, c.ID, api.LinkRequest{Role: api.LinkRoleView}); err != nil {
		t.Fatalf("admin's link: %v", err)
	}
	s.mu.Lock()
	m := s.computers[c.ID].m.(*screenMachine)
	s.mu.Unlock()
	m.mu.Lock()
	labels := append([]string{}, m.labels...)
	m.mu.Unlock()
	if len(labels) != 2 || labels[0] != "control link for owner alice" || labels[1] != "view link for admin ops" {
		t.Fatalf("minted for %q, want alice's control link and the admin's view link only", labels)
	}
	plain, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, alice, plain.ID, api.LinkRequest{Role: api.LinkRoleView}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("link of a computer without a screen = %v, want conflict", err)
	}
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: api.LinkRoleView}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("link of a suspended computer = %v, want conflict", err)
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, alice, c.ID, api.LinkRequest{Role: api.LinkRoleView}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("link of a deleted computer = %v, want conflict", err)
	}
}
