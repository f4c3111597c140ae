package httpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// Link mints a fake link for the computer's owner.
func (b *strictBackend) Link(ctx context.Context, c api.Caller, id string, req api.LinkRequest) (api.Link, error) {
	if err := b.called("Link"); err != nil {
		return api.Link{}, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return api.Link{}, err
	}
	return api.Link{Link: "http://127.0.0.1:1/#t=secret", Role: req.Role, ExpiresAt: time.Now().Add(time.Hour).UTC()}, nil
}

// TestLinkEndpoint: the owner's link request reaches the backend and
// its answer (201) is the document's, audited as a call without the
// link; another owner gets 404. Malformed bodies never reach the
// backend (the strict backend expects no call for them), and the
// positive control (a valid body) does.
func TestLinkEndpoint(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	path := "/v1/computers/" + c.ID + "/links"
	h.be.expect("Link", 1)
	a := h.do(req{method: "POST", path: path, owner: "alice", body: `{"role":"control","ttl_s":600}`})
	var l api.Link
	if a.status != http.StatusCreated || json.Unmarshal(a.body, &l) != nil || l.Role != api.LinkRoleControl || l.Link == "" {
		t.Fatalf("link: %d %s", a.status, a.body)
	}
	if a.header.Get("Cache-Control") != "no-store" {
		t.Errorf("link answer Cache-Control %q, want no-store", a.header.Get("Cache-Control"))
	}
	recs := h.audited(AuditCall)
	if len(recs) != 1 || recs[0].ID != c.ID || recs[0].Outcome != "ok" {
		t.Fatalf("link audited as %+v", recs)
	}
	if rec, _ := json.Marshal(recs[0]); strings.Contains(string(rec), "secret") {
		t.Errorf("the audit record holds the link: %s", rec)
	}
	h.be.expect("Link", 1)
	wantError(t, "bob", h.do(req{method: "POST", path: path, owner: "bob", body: `{"role":"view"}`}), 404, api.CodeNotFound)

	n := h.be.callCount()
	for _, k := range []struct {
		name, body string
		expect     expectation
	}{
		{"no role", `{}`, reqInvalid},
		{"unknown role", `{"role":"admin"}`, reqInvalid},
		{"negative ttl", `{"role":"view","ttl_s":-1}`, reqInvalid},
		{"ttl beyond a day", `{"role":"view","ttl_s":86401}`, reqInvalid},
		{"unknown field", `{"role":"view","owner":"bob"}`, reqInvalid},
	} {
		wantError(t, k.name, h.do(req{method: "POST", path: path, owner: "alice", body: k.body, expect: k.expect}), 400,
			api.CodeBadRequest)
	}
	if got := h.be.callCount(); got != n {
		t.Fatalf("malformed link requests reached the backend: %d calls", got-n)
	}
}

// TestCheckLink: the roles and the TTL's bounds and default.
func TestCheckLink(t *testing.T) {
	for _, k := range []struct {
		req  api.LinkRequest
		want time.Duration
		ok   bool
	}{
		{api.LinkRequest{Role: "view"}, api.DefaultLinkTTL, true},
		{api.LinkRequest{Role: "control", TTLSeconds: 86400}, api.MaxLinkTTL, true},
		{api.LinkRequest{Role: "control", TTLSeconds: 1}, time.Second, true},
		{api.LinkRequest{Role: "control", TTLSeconds: 86401}, 0, false},
		{api.LinkRequest{Role: "view", TTLSeconds: -1}, 0, false},
		{api.LinkRequest{Role: "View"}, 0, false},
		{api.LinkRequest{}, 0, false},
	} {
		got, err := api.CheckLink(k.req)
		if (err == nil) != k.ok || got != k.want {
			t.Errorf("CheckLink(%+v) = %v, %v; want %v, ok %v", k.req, got, err, k.want, k.ok)
			continue
		}
		if err != nil && api.CodeOf(err) != api.CodeBadRequest {
			t.Errorf("CheckLink(%+v): code %s, want bad_request", k.req, api.CodeOf(err))
		}
	}
}
