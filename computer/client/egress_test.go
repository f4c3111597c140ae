package client

import (
	"context"
	"reflect"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// egressBackend stores one policy for alice's c1; any other call panics
// through the nil embedded interface.
type egressBackend struct {
	fakeBackend
	pol *policy.Policy
}

func (b egressBackend) Egress(_ context.Context, c api.Caller, id string) (api.EgressInfo, error) {
	if id != "c1" || c.Owner != "alice" {
		return api.EgressInfo{}, api.Errorf(api.CodeNotFound, "no computer %q", id)
	}
	return api.EgressInfo{Computer: id, Policy: *b.pol, Enabled: true, Attached: true}, nil
}

func (b egressBackend) SetEgress(ctx context.Context, c api.Caller, id string, pol policy.Policy) (api.EgressInfo, error) {
	if len(pol.Presets) > 0 {
		return api.EgressInfo{}, api.Errorf(api.CodeUnknownPreset, "no preset %q", pol.Presets[0])
	}
	*b.pol = pol
	return b.Egress(ctx, c, id)
}

// TestEgress: SetEgress sends the policy and Egress reads it back; the
// service's codes come back as *api.Error (unknown_preset, not_found).
func TestEgress(t *testing.T) {
	var stored policy.Policy
	c, _ := newTLSClient(t, egressBackend{pol: &stored})
	ctx := context.Background()
	want := policy.Policy{Allow: []policy.Rule{{Host: "pypi.org"}}, Deny: []policy.Rule{{CIDR: "198.51.100.0/24"}}}
	if info, err := c.SetEgress(ctx, "c1", want); err != nil || !reflect.DeepEqual(info.Policy, want) {
		t.Fatalf("SetEgress: %+v %v", info, err)
	}
	if info, err := c.Egress(ctx, "c1"); err != nil || !reflect.DeepEqual(info.Policy, want) || !info.Attached {
		t.Fatalf("Egress: %+v %v", info, err)
	}
	if _, err := c.SetEgress(ctx, "c1", policy.Policy{Presets: []string{"nonesuch"}}); api.CodeOf(err) != api.CodeUnknownPreset {
		t.Errorf("unknown preset: %v", err)
	}
	if _, err := c.Egress(ctx, "c2"); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("Egress c2: %v", err)
	}
}
