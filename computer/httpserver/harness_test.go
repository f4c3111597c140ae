package httpserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// harness is a Server over a strictBackend behind an httptest server,
// with a token for owners alice and bob and an admin, and an audit
// recorder. Every request goes through checkedTransport.
type harness struct {
	t       *testing.T
	be      *strictBackend
	srv     *Server
	ts      *httptest.Server
	hc      *http.Client
	tokPath string
	tokens  map[string]string // owner ("admin" for the admin) -> token

	mu    sync.Mutex
	audit []AuditRecord
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, be: newStrictBackend(t), tokens: map[string]string{}}
	h.tokPath = filepath.Join(t.TempDir(), "tokens.json")
	for _, o := range []struct {
		name  string
		admin bool
	}{{"alice", false}, {"bob", false}, {"admin", true}} {
		tok, err := AddToken(h.tokPath, o.name, o.admin)
		if err != nil {
			t.Fatal(err)
		}
		h.tokens[o.name] = tok
	}
	toks, err := OpenTokens(h.tokPath)
	if err != nil {
		t.Fatal(err)
	}
	h.srv, err = New(Config{Backend: h.be, Tokens: toks, Audit: h.record, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h.ts = httptest.NewServer(h.srv)
	t.Cleanup(h.ts.Close)
	h.hc = &http.Client{Transport: checkedTransport{t: t, next: h.ts.Client().Transport}}
	return h
}

func (h *harness) record(r AuditRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.audit = append(h.audit, r)
}

// audited returns the audit records of action.
func (h *harness) audited(action string) []AuditRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []AuditRecord
	for _, r := range h.audit {
		if r.Action == action {
			out = append(out, r)
		}
	}
	return out
}

// req describes one request of a test.
type req struct {
	method, path, owner string // owner names the token; "" sends none
	body                string // sent as application/json when not empty
	contentType         string // overrides the content type
	expect              expectation
}

// answer is a response with its body read.
type answer struct {
	status int
	body   []byte
	header http.Header
}

// do sends r and returns the answer.
func (h *harness) do(r req) answer {
	h.t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	hr, err := http.NewRequestWithContext(withExpect(context.Background(), r.expect), r.method, h.ts.URL+r.path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	switch {
	case r.contentType != "":
		hr.Header.Set("Content-Type", r.contentType)
	case r.body != "":
		hr.Header.Set("Content-Type", "application/json")
	}
	if r.owner != "" {
		hr.Header.Set("Authorization", "Bearer "+h.tokens[r.owner])
	}
	resp, err := h.hc.Do(hr)
	if err != nil {
		h.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, body: b, header: resp.Header}
}

// errorOf decodes an error answer's body.
func errorOf(t *testing.T, a answer) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("answer %d %q is no error body: %v", a.status, a.body, err)
	}
	return e
}

// wantError checks a's status and code.
func wantError(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: status %d (%s), want %d", what, a.status, a.body, status)
		return
	}
	if e := errorOf(t, a); e.Code != code || e.Message == "" {
		t.Errorf("%s: error %+v, want code %q and a message", what, e, code)
	}
}

// jsonDecode decodes an answer's body (the test's own reading).
func jsonDecode(b []byte, v any) error { return json.Unmarshal(b, v) }
