package service

import (
	"context"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// TestTierPicksItsProvisioner: a create naming tier vm is prepared and
// torn down by the VM tier's provisioner only, and says its tier; one
// naming no tier goes to the default provisioner; an unknown tier, and
// an import into the VM tier, are refused with nothing made.
func TestTierPicksItsProvisioner(t *testing.T) {
	vmProv := newStrictProv(t)
	s, local := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: vmProv}})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tier != api.TierVM {
		t.Fatalf("tier %q, want vm", c.Tier)
	}
	if vmProv.count("Prepare") != 1 || local.count("Prepare") != 0 {
		t.Fatalf("prepares: vm %v, default %v", vmProv.allCalls(), local.allCalls())
	}
	n, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil || n.Tier != api.TierNamespaced || local.count("Prepare") != 1 {
		t.Fatalf("create without a tier: %+v %v; default prepares %v", n, err, local.allCalls())
	}
	if err := s.Delete(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if vmProv.count("Close") != 1 || local.count("Close") != 0 {
		t.Fatalf("closes: vm %v, default %v", vmProv.allCalls(), local.allCalls())
	}
	if _, err := s.Create(ctx, alice, api.CreateRequest{Tier: "bhyve"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("unknown tier = %v, want bad_request", err)
	}
	_, err = s.Import(ctx, alice, api.CreateRequest{Tier: api.TierVM}, strings.NewReader("x"), strings.Repeat("0", 64))
	if api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("import into tier vm = %v, want bad_request", err)
	}
	if vmProv.count("Prepare") != 1 {
		t.Fatalf("a refused request made a machine: %v", vmProv.allCalls())
	}
}

// TestTierNotOfferedIsRefused: without a VM provisioner, tier vm is
// bad_request (the positive control of the routing above).
func TestTierNotOfferedIsRefused(t *testing.T) {
	s, local := newTestService(t, Config{})
	_, err := s.Create(context.Background(), alice, api.CreateRequest{Tier: api.TierVM})
	if api.CodeOf(err) != api.CodeBadRequest || local.count("Prepare") != 0 {
		t.Fatalf("tier vm on a service without it = %v (prepares %v)", err, local.allCalls())
	}
}

// TestTierEgress: both tiers reach the egress proxy (a VM computer over
// its wire link), so a policy that allows something passes for either;
// for a tier that cannot reach it only a deny-all policy passes.
func TestTierEgress(t *testing.T) {
	allow := policy.Policy{Allow: []policy.Rule{{Host: "example.com", Ports: []uint16{443}}}}
	if err := tierEgress("bhyve", allow); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("a tier that cannot reach the proxy with an allow rule = %v, want bad_request", err)
	}
	for _, tc := range []struct {
		tier string
		pol  policy.Policy
	}{{"", allow}, {api.TierNamespaced, allow}, {api.TierVM, allow}, {api.TierVM, policy.Policy{}}, {"bhyve", policy.Policy{}}} {
		if err := tierEgress(tc.tier, tc.pol); err != nil {
			t.Fatalf("tier %q, policy %+v: %v", tc.tier, tc.pol, err)
		}
	}
}
