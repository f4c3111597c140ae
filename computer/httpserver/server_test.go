package httpserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// TestOpenAPIDocument: the embedded document is a valid OpenAPI 3
// document, every wire bound the server checks is the document's, and
// the Error code enum is exactly the closed set.
func TestOpenAPIDocument(t *testing.T) {
	doc, _ := loadDoc(t)
	max := func(schema, prop string) float64 {
		t.Helper()
		s := doc.Components.Schemas[schema].Value.Properties[prop].Value
		if s.Max == nil || s.Min == nil {
			t.Fatalf("%s.%s has no minimum or maximum", schema, prop)
		}
		return *s.Max
	}
	bounds := []struct {
		schema, prop string
		want         int64
	}{
		{"Limits", "memory_bytes", MaxMemoryBytes}, {"Limits", "pids", MaxPids}, {"Limits", "disk_bytes", MaxDiskBytes},
		{"CreateRequest", "lease_ttl_s", MaxLeaseTTLSeconds}, {"CreateRequest", "idle_timeout_s", MaxIdleTimeoutSeconds},
		{"CreateRequest", "queue_timeout_s", MaxQueueTimeoutSeconds}, {"RenewRequest", "lease_ttl_s", MaxLeaseTTLSeconds},
		{"LinkRequest", "ttl_s", int64(api.MaxLinkTTL / time.Second)},
	}
	for _, b := range bounds {
		if got := max(b.schema, b.prop); got != float64(b.want) {
			t.Errorf("%s.%s maximum %v, the server checks %d", b.schema, b.prop, got, b.want)
		}
	}
	for _, name := range []string{"Limits", "CreateRequest", "RenewRequest", "Computer", "ComputerList", "Event", "Error", "Tuple", "Receipt", "ImportResult", "LinkRequest", "Link"} {
		ap := doc.Components.Schemas[name].Value.AdditionalProperties
		if ap.Has == nil || *ap.Has {
			t.Errorf("schema %s admits additional properties", name)
		}
	}
	var codes []string
	for _, v := range doc.Components.Schemas["Error"].Value.Properties["code"].Value.Enum {
		codes = append(codes, v.(string))
	}
	if len(codes) != len(statusOf) {
		t.Errorf("Error.code enum %v, the server maps %d codes", codes, len(statusOf))
	}
	for _, c := range codes {
		if _, ok := statusOf[c]; !ok {
			t.Errorf("Error.code %q has no status", c)
		}
	}
}

// TestRoutesAreTheDocument: the server serves exactly the operations
// of the document, no more and no fewer.
func TestRoutesAreTheDocument(t *testing.T) {
	doc, _ := loadDoc(t)
	inDoc := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inDoc[method+" "+path] = true
		}
	}
	h := newHarness(t)
	served := map[string]bool{}
	for _, r := range h.srv.routeTable() {
		served[r.pattern] = true
		if !inDoc[r.pattern] {
			t.Errorf("the server serves %q, the document lacks it", r.pattern)
		}
	}
	for op := range inDoc {
		if !served[op] {
			t.Errorf("the document has %q, the server does not serve it", op)
		}
	}
	if len(served) == 0 {
		t.Fatal("no routes")
	}
}

// TestEndpoints calls every endpoint as an owner, each request and
// answer validated against the document.
func TestEndpoints(t *testing.T) {
	h := newHarness(t)
	h.be.expect("Create", 1)
	a := h.do(req{method: "POST", path: "/v1/computers", owner: "alice",
		body: `{"limits":{"memory_bytes":268435456,"pids":128},"lease_ttl_s":3600,"idle_timeout_s":600,"labels":{"team":"a"},"queue_timeout_s":30}`})
	if a.status != http.StatusCreated {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	var c api.Computer
	if err := json.Unmarshal(a.body, &c); err != nil || c.Owner != "alice" || c.Labels["team"] != "a" {
		t.Fatalf("create answered %s (%v): want alice's computer with its label", a.body, err)
	}
	if recs := h.audited(AuditCall); len(recs) != 1 || recs[0].Who != "alice" || recs[0].ID != c.ID || recs[0].Outcome != "ok" {
		t.Errorf("create audited as %+v, want one call by alice on %s, ok", recs, c.ID)
	}
	id := "/v1/computers/" + c.ID
	calls := []struct {
		method, path, body, backend string
		status                      int
	}{
		{"GET", "/v1/computers", "", "List", 200},
		{"GET", id, "", "Get", 200},
		{"POST", id + "/renew", `{"lease_ttl_s":7200}`, "Renew", 200},
		{"POST", id + "/suspend", "", "Suspend", 200},
		{"POST", id + "/resume", "", "Resume", 200},
		{"DELETE", id, "", "Delete", 204},
		{"GET", id, "", "Get", 404},
	}
	for _, k := range calls {
		h.be.expect(k.backend, 1)
		a := h.do(req{method: k.method, path: k.path, owner: "alice", body: k.body})
		if a.status != k.status {
			t.Errorf("%s %s: %d %s, want %d", k.method, k.path, a.status, a.body, k.status)
		}
	}
	for _, p := range []string{"/healthz", "/v1/openapi.json"} {
		if a := h.do(req{method: "GET", path: p}); a.status != 200 {
			t.Errorf("GET %s: %d", p, a.status)
		}
	}
	if a := h.do(req{method: "GET", path: "/v1/openapi.json"}); string(a.body) != string(api.OpenAPI) {
		t.Error("/v1/openapi.json does not serve the embedded document")
	}
}

// TestErrorCodes: every code a backend returns reaches the client with
// its status and a body the document admits; an error without a code
// is internal and its detail stays in the log.
func TestErrorCodes(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	for code := range statusOf {
		h.be.fail = api.Errorf(code, "because %s", code)
		h.be.expect("Get", 1)
		a := h.do(req{method: "GET", path: "/v1/computers/" + c.ID, owner: "alice"})
		wantError(t, code, a, StatusOf(code), code)
	}
	h.be.fail = errors.New("secret detail /var/lib/x")
	h.be.expect("Get", 1)
	a := h.do(req{method: "GET", path: "/v1/computers/" + c.ID, owner: "alice"})
	wantError(t, "plain error", a, 500, api.CodeInternal)
	if strings.Contains(string(a.body), "secret") {
		t.Errorf("internal error leaked its detail: %s", a.body)
	}
	h.be.fail = api.Errorf("no_such_code", "x")
	h.be.expect("Get", 1)
	wantError(t, "unknown code", h.do(req{method: "GET", path: "/v1/computers/" + c.ID, owner: "alice"}), 500, api.CodeInternal)
}

// TestRefusesBadRequests is the attack test of the request checks: each
// body below is refused with a 4xx closed code, and the backend is never
// called (the strict backend expects nothing). Positive control: a valid
// body with the same backend reaches it.
func TestRefusesBadRequests(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	renew := "/v1/computers/" + c.ID + "/renew"
	huge := `{"labels":{"a":"` + strings.Repeat("x", MaxBodyBytes) + `"}}`
	cases := []struct {
		name, path, body, ctype string
		expect                  expectation
		status                  int
		code                    string
	}{
		{"malformed", "/v1/computers", `{"lease_ttl_s":`, "", reqInvalid, 400, api.CodeBadRequest},
		{"not an object", "/v1/computers", `[]`, "", reqInvalid, 400, api.CodeBadRequest},
		{"empty body", "/v1/computers", ``, "application/json", reqInvalid, 400, api.CodeBadRequest},
		{"unknown field", "/v1/computers", `{"owner":"bob"}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"unknown limit", "/v1/computers", `{"limits":{"cpus":4}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"case-folded key", "/v1/computers", `{"Lease_TTL_s":60}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"duplicate key", "/v1/computers", `{"lease_ttl_s":60,"lease_ttl_s":99999999}`, "", reqUnexpressive, 400, api.CodeBadRequest},
		{"escaped duplicate", "/v1/computers", `{"lease_ttl_s":60,"lease_ttl_\u0073":1}`, "", reqUnexpressive, 400, api.CodeBadRequest},
		{"trailing data", "/v1/computers", `{} {}`, "", reqUnexpressive, 400, api.CodeBadRequest},
		{"wrong type", "/v1/computers", `{"lease_ttl_s":"60"}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"negative memory", "/v1/computers", `{"limits":{"memory_bytes":-1}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"huge memory", "/v1/computers", `{"limits":{"memory_bytes":9223372036854775807}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"overflowing pids", "/v1/computers", `{"limits":{"pids":99999999999999999999}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"huge disk", "/v1/computers", `{"limits":{"disk_bytes":1099511627777}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"ttl beyond max", "/v1/computers", fmt.Sprintf(`{"lease_ttl_s":%d}`, MaxLeaseTTLSeconds+1), "", reqInvalid, 400, api.CodeBadRequest},
		{"negative ttl", "/v1/computers", `{"lease_ttl_s":-5}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"fractional ttl", "/v1/computers", `{"lease_ttl_s":1.5}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"idle beyond max", "/v1/computers", `{"idle_timeout_s":86401}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"queue beyond max", "/v1/computers", `{"queue_timeout_s":3601}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"label key", "/v1/computers", `{"labels":{"Bad Key":"v"}}`, "", reqUnexpressive, 400, api.CodeBadRequest},
		{"label value", "/v1/computers", `{"labels":{"k":"` + strings.Repeat("v", MaxLabelValue+1) + `"}}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"deep nesting", "/v1/computers", `{"labels":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"invalid utf-8", "/v1/computers", "{\"labels\":{\"k\":\"\xff\"}}", "", reqUnexpressive, 400, api.CodeBadRequest},
		{"text body", "/v1/computers", `{}`, "text/plain", reqInvalid, 400, api.CodeBadRequest},
		{"oversized", "/v1/computers", huge, "", reqInvalid, 413, api.CodeTooLarge},
		{"renew zero", renew, `{"lease_ttl_s":0}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"renew missing", renew, `{}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"renew beyond max", renew, `{"lease_ttl_s":604801}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"renew unknown", renew, `{"lease_ttl_s":60,"owner":"bob"}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"suspend with body", "/v1/computers/" + c.ID + "/suspend", `{}`, "", reqInvalid, 400, api.CodeBadRequest},
		{"bad id", "/v1/computers/-x", "", "", reqInvalid, 400, api.CodeBadRequest},
		{"long id", "/v1/computers/" + strings.Repeat("a", 129), "", "", reqInvalid, 400, api.CodeBadRequest},
	}
	for _, k := range cases {
		method := "POST"
		if strings.HasSuffix(k.name, " id") {
			method = "GET"
		}
		a := h.do(req{method: method, path: k.path, owner: "alice", body: k.body, contentType: k.ctype, expect: k.expect})
		wantError(t, k.name, a, k.status, k.code)
	}
	if n := h.be.callCount(); n != 0 {
		t.Fatalf("the backend was called %d times for refused requests: %v", n, h.be.calls)
	}
	// Positive control: the strict backend does see a valid request.
	h.be.expect("Create", 1)
	a := h.do(req{method: "POST", path: "/v1/computers", owner: "alice", body: fmt.Sprintf(`{"lease_ttl_s":%d}`, MaxLeaseTTLSeconds)})
	if a.status != 201 || h.be.callCount() != 1 {
		t.Fatalf("valid create: %d %s, backend calls %d; want 201 and one call", a.status, a.body, h.be.callCount())
	}
}

// TestOwnerIsolation: bob asking for alice's computer by id answers 404
// on every endpoint and each attempt is audited with who, what id and
// when; the owner comes from the token, so a body cannot claim another.
// Positive control: alice gets her computer; the admin sees it too.
func TestOwnerIsolation(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	id := "/v1/computers/" + c.ID
	probes := []struct{ method, path, body, backend string }{
		{"GET", id, "", "Get"}, {"DELETE", id, "", "Delete"}, {"POST", id + "/renew", `{"lease_ttl_s":60}`, "Renew"},
		{"POST", id + "/suspend", "", "Suspend"}, {"POST", id + "/resume", "", "Resume"},
	}
	for _, p := range probes {
		h.be.expect(p.backend, 1)
		wantError(t, "bob "+p.method+" "+p.path, h.do(req{method: p.method, path: p.path, owner: "bob", body: p.body}), 404, api.CodeNotFound)
	}
	recs := h.audited(AuditNotFound)
	if len(recs) != len(probes) {
		t.Fatalf("%d not_found audit records, want %d: %+v", len(recs), len(probes), recs)
	}
	for _, r := range recs {
		if r.Who != "bob" || r.ID != c.ID || r.Time.IsZero() {
			t.Errorf("audit record %+v: want who bob, id %s, a time", r, c.ID)
		}
	}
	h.be.expect("List", 1)
	if a := h.do(req{method: "GET", path: "/v1/computers", owner: "bob"}); !strings.Contains(string(a.body), `"computers":[]`) {
		t.Errorf("bob's list shows %s, want none", a.body)
	}
	h.be.expect("Get", 2)
	if a := h.do(req{method: "GET", path: id, owner: "alice"}); a.status != 200 {
		t.Errorf("positive control: alice GET her computer: %d %s", a.status, a.body)
	}
	if a := h.do(req{method: "GET", path: id, owner: "admin"}); a.status != 200 {
		t.Errorf("positive control: admin GET alice's computer: %d %s", a.status, a.body)
	}
}

// TestMountAdminOnly: a mounted handler (such as /metrics) answers the
// admin only; an owner gets 404, no credential 401.
func TestMountAdminOnly(t *testing.T) {
	h := newHarness(t)
	h.srv.Mount("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("up 1\n"))
	}))
	for _, k := range []struct {
		owner  string
		status int
	}{{"", 401}, {"alice", 404}, {"admin", 200}} {
		hr, _ := http.NewRequest("GET", h.ts.URL+"/metrics", nil)
		if k.owner != "" {
			hr.Header.Set("Authorization", "Bearer "+h.tokens[k.owner])
		}
		resp, err := h.ts.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != k.status {
			t.Errorf("/metrics as %q: %d, want %d", k.owner, resp.StatusCode, k.status)
		}
	}
}

// TestUnknownEndpoint: a path or method outside the document answers
// 404 not_found as JSON (not Go's plain-text 404 or 405), and the
// backend is never called. These requests are outside the document, so
// they bypass its validation.
func TestUnknownEndpoint(t *testing.T) {
	h := newHarness(t)
	for _, k := range []struct{ method, path string }{{"GET", "/v1/nope"}, {"PUT", "/v1/computers"}, {"PATCH", "/v1/computers/c1"}, {"GET", "/"}} {
		r, _ := http.NewRequest(k.method, h.ts.URL+k.path, nil)
		r.Header.Set("Authorization", "Bearer "+h.tokens["alice"])
		resp, err := h.ts.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 404 || err != nil || e.Code != api.CodeNotFound {
			t.Errorf("%s %s: %d %+v %v, want 404 not_found", k.method, k.path, resp.StatusCode, e, err)
		}
	}
	if h.be.callCount() != 0 {
		t.Fatal("the backend was called")
	}
}
