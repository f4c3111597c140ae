package httpserver

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// Egress returns id's stored policy (strictBackend keeps one per id).
func (b *strictBackend) Egress(ctx context.Context, c api.Caller, id string) (api.EgressInfo, error) {
	if err := b.called("Egress"); err != nil {
		return api.EgressInfo{}, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return api.EgressInfo{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return api.EgressInfo{Computer: id, Policy: b.egress[id], Enabled: true, Attached: true,
		RefusalLog: "/run/tether/egress-refused.log"}, nil
}

// SetEgress stores pol for id; a preset other than "pypi" is unknown.
func (b *strictBackend) SetEgress(ctx context.Context, c api.Caller, id string, pol policy.Policy) (api.EgressInfo, error) {
	if err := b.called("SetEgress"); err != nil {
		return api.EgressInfo{}, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return api.EgressInfo{}, err
	}
	for _, p := range pol.Presets {
		if p != "pypi" {
			return api.EgressInfo{}, api.Errorf(api.CodeUnknownPreset, "no preset %q", p)
		}
	}
	b.mu.Lock()
	if b.egress == nil {
		b.egress = map[string]policy.Policy{}
	}
	b.egress[id] = pol
	b.mu.Unlock()
	return b.Egress(ctx, c, id)
}

// TestEgressEndpoints: PUT stores a policy and answers what is stored,
// GET reads it back, each request and answer validated against the
// document; the change is audited; an unknown preset answers
// unknown_preset; another owner gets 404; malformed policies never reach
// the backend (the strict backend expects no call for them).
func TestEgressEndpoints(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	path := "/v1/computers/" + c.ID + "/egress"
	want := policy.Policy{Allow: []policy.Rule{{Host: "pypi.org"}, {CIDR: "203.0.113.0/24", Ports: []uint16{8443}}},
		Deny: []policy.Rule{{Host: "evil.pypi.org"}}, Presets: []string{"pypi"}}
	body, _ := json.Marshal(want)
	h.be.expect("SetEgress", 1)
	h.be.expect("Egress", 2)
	a := h.do(req{method: "PUT", path: path, owner: "alice", body: string(body)})
	var info api.EgressInfo
	if a.status != 200 || json.Unmarshal(a.body, &info) != nil || !reflect.DeepEqual(info.Policy, want) {
		t.Fatalf("PUT: %d %s", a.status, a.body)
	}
	if recs := h.audited(AuditCall); len(recs) != 1 || recs[0].ID != c.ID || recs[0].Method != "PUT" || recs[0].Outcome != "ok" {
		t.Fatalf("PUT audited as %+v", recs)
	}
	a = h.do(req{method: "GET", path: path, owner: "alice"})
	if a.status != 200 || json.Unmarshal(a.body, &info) != nil || !reflect.DeepEqual(info.Policy, want) || !info.Attached {
		t.Fatalf("GET: %d %s", a.status, a.body)
	}

	h.be.expect("SetEgress", 1)
	wantError(t, "unknown preset", h.do(req{method: "PUT", path: path, owner: "alice", body: `{"presets":["nonesuch"]}`}),
		400, api.CodeUnknownPreset)
	h.be.expect("SetEgress", 1)
	h.be.expect("Egress", 1)
	wantError(t, "bob PUT", h.do(req{method: "PUT", path: path, owner: "bob", body: `{}`}), 404, api.CodeNotFound)
	wantError(t, "bob GET", h.do(req{method: "GET", path: path, owner: "bob"}), 404, api.CodeNotFound)

	n := h.be.callCount()
	bad := []struct {
		name, body string
		expect     expectation
	}{
		{"ip literal host", `{"allow":[{"host":"127.0.0.1"}]}`, reqUnexpressive},
		{"host and cidr", `{"allow":[{"host":"a.example","cidr":"10.0.0.0/8"}]}`, reqUnexpressive},
		{"port zero", `{"allow":[{"host":"a.example","ports":[0]}]}`, reqInvalid},
		{"unknown field", `{"allow":[{"host":"a.example","proto":"udp"}]}`, reqInvalid},
		{"bad preset name", `{"presets":["Bad Name"]}`, reqInvalid},
		{"unmasked cidr", `{"deny":[{"cidr":"10.0.0.1/8"}]}`, reqUnexpressive},
	}
	for _, k := range bad {
		wantError(t, k.name, h.do(req{method: "PUT", path: path, owner: "alice", body: k.body, expect: k.expect}), 400,
			api.CodeBadRequest)
		wantError(t, "create with "+k.name, h.do(req{method: "POST", path: "/v1/computers", owner: "alice",
			body: `{"egress":` + k.body + `}`, expect: k.expect}), 400, api.CodeBadRequest)
	}
	if got := h.be.callCount(); got != n {
		t.Fatalf("malformed policies reached the backend: %d calls", got-n)
	}
	// Positive control: a create with a well-formed policy reaches it.
	h.be.expect("Create", 1)
	if a := h.do(req{method: "POST", path: "/v1/computers", owner: "alice", body: `{"egress":{"allow":[{"host":"*.github.com","ports":[443]}]}}`}); a.status != 201 {
		t.Fatalf("create with a policy: %d %s", a.status, a.body)
	}
}
