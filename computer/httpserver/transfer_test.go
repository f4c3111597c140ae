package httpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3filter"

	"github.com/tetherdev/tether/computer/api"
)

func init() {
	// The document's binary bodies: kin-openapi reads them as files.
	openapi3filter.RegisterBodyDecoder("application/zstd", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/x-tar", openapi3filter.FileBodyDecoder)
}

// stream sends a request with a binary body of content type ctype
// (chunked when chunked is set, so no Content-Length tells its size)
// through the checked transport.
func (h *harness) stream(method, path, owner, ctype, body string, chunked bool, expect expectation) answer {
	h.t.Helper()
	var rd io.Reader
	if body != "" || method == "PUT" || method == "POST" {
		rd = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd)
		}
	}
	hr, err := http.NewRequestWithContext(withExpect(context.Background(), expect), method, h.ts.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if ctype != "" {
		hr.Header.Set("Content-Type", ctype)
	}
	if owner != "" {
		hr.Header.Set("Authorization", "Bearer "+h.tokens[owner])
	}
	resp, err := h.hc.Do(hr)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, body: b, header: resp.Header}
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestTransferEndpoints calls touch, export, copy out, copy in and
// import as an owner, each request and answer validated against the
// document; a streamed answer's SHA-256 header is the digest of its
// body, and every call is audited.
func TestTransferEndpoints(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	id := "/v1/computers/" + c.ID
	h.be.expect("TouchAs", 1)
	if a := h.stream("POST", id+"/touch", "alice", "", "", false, reqValid); a.status != 200 {
		t.Errorf("touch: %d %s", a.status, a.body)
	}
	for _, k := range []struct{ path, backend, ctype string }{
		{id + "/export", "Export", "application/zstd"},
		{id + "/files?path=%2Fwork%2Fproj", "CopyOut", "application/x-tar"},
	} {
		h.be.expect(k.backend, 1)
		a := h.stream("GET", k.path, "alice", "", "", false, reqValid)
		if a.status != 200 || string(a.body) != streamOf(c.ID) || a.header.Get("Content-Type") != k.ctype {
			t.Errorf("GET %s: %d %q %q", k.path, a.status, a.body, a.header.Get("Content-Type"))
		}
		if got := a.header.Get(api.HeaderSHA256); got != hexSum(a.body) {
			t.Errorf("GET %s: %s %q, the body's digest is %s", k.path, api.HeaderSHA256, got, hexSum(a.body))
		}
	}
	h.be.expect("CopyIn", 1)
	a := h.stream("PUT", id+"/files?path=%2Fwork", "alice", "application/x-tar", "tar bytes", false, reqValid)
	var rec api.Receipt
	if err := json.Unmarshal(a.body, &rec); a.status != 200 || err != nil || rec.SHA256 != hexSum([]byte("tar bytes")) || rec.Path != "/work" {
		t.Errorf("copy in: %d %s (%v)", a.status, a.body, err)
	}
	h.be.expect("Import", 1)
	export := "tar.zst bytes"
	a = h.stream("POST", "/v1/computers/import?sha256="+hexSum([]byte(export))+"&lease_ttl_s=600&disk_bytes=134217728&tier=vm",
		"alice", "application/zstd", export, false, reqValid)
	var res api.ImportResult
	if err := json.Unmarshal(a.body, &res); a.status != 201 || err != nil || res.Computer.Owner != "alice" || res.Receipt.Computer != res.Computer.ID {
		t.Errorf("import: %d %s (%v)", a.status, a.body, err)
	}
	h.be.mu.Lock()
	if h.be.importTier != api.TierVM {
		t.Errorf("import named tier vm; the backend got %q", h.be.importTier)
	}
	h.be.mu.Unlock()
	if n := len(h.audited(AuditCall)); n != 5 {
		t.Errorf("%d call audit records, want 5 (touch, export, copy out, copy in, import)", n)
	}
}

// TestTransferOwnerIsolation is the attack test of owner isolation on
// the transfer endpoints: bob naming alice's computer gets 404 on each,
// and each attempt is audited with who and which id. Positive control:
// alice (and the admin) reach the same endpoints.
func TestTransferOwnerIsolation(t *testing.T) {
	h := newHarness(t)
	c := h.be.add("alice")
	id := "/v1/computers/" + c.ID
	probes := []struct{ method, path, ctype, body, backend string }{
		{"POST", id + "/touch", "", "", "TouchAs"},
		{"GET", id + "/receipts", "", "", "Receipts"},
		{"GET", id + "/export", "", "", "Export"},
		{"GET", id + "/files?path=%2Fwork", "", "", "CopyOut"},
		{"PUT", id + "/files?path=%2Fwork", "application/x-tar", "tar", "CopyIn"},
	}
	for _, p := range probes {
		h.be.expect(p.backend, 1)
		a := h.stream(p.method, p.path, "bob", p.ctype, p.body, false, reqValid)
		wantError(t, "bob "+p.method+" "+p.path, a, 404, api.CodeNotFound)
	}
	recs := h.audited(AuditNotFound)
	if len(recs) != len(probes) {
		t.Fatalf("%d not_found audit records, want %d: %+v", len(recs), len(probes), recs)
	}
	for _, r := range recs {
		if r.Who != "bob" || r.ID != c.ID {
			t.Errorf("audit record %+v: want who bob, id %s", r, c.ID)
		}
	}
	for _, owner := range []string{"alice", "admin"} {
		for _, p := range probes {
			h.be.expect(p.backend, 1)
			if a := h.stream(p.method, p.path, owner, p.ctype, p.body, false, reqValid); a.status != 200 {
				t.Errorf("positive control: %s %s %s: %d %s", owner, p.method, p.path, a.status, a.body)
			}
		}
	}
}

// TestTransferRefusals: malformed transfer requests are refused with a
// closed code before the backend is called (the strict backend expects
// nothing); a body over the stream cap is too_large whether its length
// is declared or only found while reading. Positive control: the same
// copy in under the cap reaches the backend.
func TestTransferRefusals(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg.MaxStreamBytes = 16
	c := h.be.add("alice")
	id := "/v1/computers/" + c.ID
	good := hexSum([]byte("x"))
	cases := []struct {
		name, method, path, ctype, body string
		expect                          expectation
		status                          int
		code                            string
	}{
		{"import without sha256", "POST", "/v1/computers/import", "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"import upper-case sha256", "POST", "/v1/computers/import?sha256=" + strings.ToUpper(good), "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"import short sha256", "POST", "/v1/computers/import?sha256=abc", "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"import as json", "POST", "/v1/computers/import?sha256=" + good, "application/json", "{}", reqInvalid, 400, api.CodeBadRequest},
		{"import huge ttl", "POST", "/v1/computers/import?sha256=" + good + "&lease_ttl_s=604801", "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"import negative disk", "POST", "/v1/computers/import?sha256=" + good + "&disk_bytes=-1", "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"import unknown parameter", "POST", "/v1/computers/import?sha256=" + good + "&owner=bob", "application/zstd", "x", reqUnexpressive, 400, api.CodeBadRequest},
		{"import sha256 twice", "POST", "/v1/computers/import?sha256=" + good + "&sha256=" + good, "application/zstd", "x", reqUnexpressive, 400, api.CodeBadRequest},
		{"import over the cap", "POST", "/v1/computers/import?sha256=" + good, "application/zstd", strings.Repeat("x", 17), reqValid, 413, api.CodeTooLarge},
		{"copy in without path", "PUT", id + "/files", "application/x-tar", "x", reqInvalid, 400, api.CodeBadRequest},
		{"copy in relative path", "PUT", id + "/files?path=work", "application/x-tar", "x", reqInvalid, 400, api.CodeBadRequest},
		{"copy in as zstd", "PUT", id + "/files?path=%2Fwork", "application/zstd", "x", reqInvalid, 400, api.CodeBadRequest},
		{"copy in over the cap", "PUT", id + "/files?path=%2Fwork", "application/x-tar", strings.Repeat("x", 17), reqValid, 413, api.CodeTooLarge},
		{"copy out long path", "GET", id + "/files?path=%2F" + strings.Repeat("a", maxPathBytes), "", "", reqInvalid, 400, api.CodeBadRequest},
		{"copy out NUL", "GET", id + "/files?path=%2Fa%00b", "", "", reqUnexpressive, 400, api.CodeBadRequest},
		{"touch with body", "POST", id + "/touch", "application/json", "{}", reqInvalid, 400, api.CodeBadRequest},
		{"export bad id", "GET", "/v1/computers/-x/export", "", "", reqInvalid, 400, api.CodeBadRequest},
	}
	for _, k := range cases {
		wantError(t, k.name, h.stream(k.method, k.path, "alice", k.ctype, k.body, false, k.expect), k.status, k.code)
	}
	if n := h.be.callCount(); n != 0 {
		t.Fatalf("the backend was called %d times for refused requests: %v", n, h.be.calls)
	}
	// A chunked body says no length: the cap is found while the backend
	// reads it.
	h.be.expect("CopyIn", 1)
	wantError(t, "chunked copy in over the cap",
		h.stream("PUT", id+"/files?path=%2Fwork", "alice", "application/x-tar", strings.Repeat("x", 17), true, reqValid), 413, api.CodeTooLarge)
	h.be.expect("CopyIn", 1)
	if a := h.stream("PUT", id+"/files?path=%2Fwork", "alice", "application/x-tar", strings.Repeat("x", 16), true, reqValid); a.status != 200 {
		t.Errorf("positive control: copy in of 16 bytes: %d %s", a.status, a.body)
	}
}
