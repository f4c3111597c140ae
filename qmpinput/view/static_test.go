package view

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestVendoredNoVNCUnchanged: the embedded noVNC is exactly the files
// SHA256SUMS lists (as npm shipped them), no more, no fewer.
func TestVendoredNoVNCUnchanged(t *testing.T) {
	sums, err := fs.ReadFile(web, "web/third_party/novnc/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		want[strings.TrimPrefix(name, "./")] = sum
	}
	seen := 0
	fs.WalkDir(web, "web/third_party/novnc", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := strings.TrimPrefix(p, "web/third_party/novnc/")
		if name == "SHA256SUMS" || name == "VENDORED.md" {
			return nil
		}
		b, _ := fs.ReadFile(web, p)
		s := sha256.Sum256(b)
		if want[name] != hex.EncodeToString(s[:]) {
			t.Errorf("%s differs from the vendored noVNC 1.7.0 (or is not listed)", name)
		}
		seen++
		return nil
	})
	if seen != len(want) || seen < 50 {
		t.Fatalf("embedded %d files, SHA256SUMS lists %d", seen, len(want))
	}
}

// TestStaticServing: only embedded files by exact name, with the
// security headers; no directory listing, no other method, no other host.
func TestStaticServing(t *testing.T) {
	s := &Server{hosts: map[string]bool{"127.0.0.1:8443": true}, origins: map[string]bool{"http://127.0.0.1:8443": true}}
	h := securityHeaders(s.static())
	get := func(method, path, host string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "http://"+host+path, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := get(http.MethodGet, "/", "127.0.0.1:8443")
	csp := w.Header().Get("Content-Security-Policy")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "tether live view") || !strings.Contains(csp, "script-src 'self'") ||
		!strings.Contains(csp, "frame-ancestors 'none'") || w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("index: %d %v", w.Code, w.Header())
	}
	if w := get(http.MethodGet, "/novnc/core/rfb.js", "127.0.0.1:8443"); w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/javascript") {
		t.Fatalf("rfb.js: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	for _, p := range []string{"/novnc/", "/novnc/core", "/novnc/SHA256SUMS", "/third_party/novnc/core/rfb.js", "/../go.mod", "/api/other", "/nothing"} {
		if w := get(http.MethodGet, p, "127.0.0.1:8443"); w.Code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", p, w.Code)
		}
	}
	if w := get(http.MethodPost, "/", "127.0.0.1:8443"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", w.Code)
	}
	if w := get(http.MethodGet, "/", "attacker.example"); w.Code != http.StatusForbidden {
		t.Errorf("foreign host: %d", w.Code)
	}
}
