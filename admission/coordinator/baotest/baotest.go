// Package baotest is a stand-in for the two OpenBao endpoints the
// coordinator calls, for tests and demos on machines where no OpenBao
// server can run. It serves exactly PUT /v1/auth/token/renew-self or PUT
// /v1/sys/leases/renew (whichever Expect names) over TLS, checks the
// X-Vault-Token header and the exact JSON body, and fails the test on any
// other request.
package baotest

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sync"
)

// Reporter receives a failure for every unexpected request; a
// *testing.T is one. If it also has Cleanup (as testing.TB does), the
// server closes itself at cleanup.
type Reporter interface {
	Errorf(format string, args ...any)
}

// Expect is the one request the server accepts.
type Expect struct {
	Token     string // the X-Vault-Token every request must carry
	Mode      string // "token" (renew-self) or "lease" (sys/leases/renew)
	LeaseID   string // the lease_id a lease renewal must name
	Increment int    // the increment every request must ask for
}

// Server is a TLS httptest server playing OpenBao. Close it when done (the
// constructor registers Close with t.Cleanup as well).
type Server struct {
	*httptest.Server
	t      Reporter
	expect Expect

	mu      sync.Mutex
	ttl     int
	status  int    // non-zero: fail with this status
	message string // error message when failing
	calls   int
	onRenew func()
}

// NewServer starts a server that grants ttl seconds on each renewal. Mode
// must be "token" or "lease". The caller closes it (automatically when t
// has Cleanup).
func NewServer(t Reporter, e Expect, ttl int) (*Server, error) {
	if e.Mode != "token" && e.Mode != "lease" {
		return nil, fmt.Errorf("baotest: mode %q is not token or lease", e.Mode)
	}
	s := &Server{t: t, expect: e, ttl: ttl}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	if c, ok := t.(interface{ Cleanup(func()) }); ok {
		c.Cleanup(s.Close)
	}
	return s, nil
}

// Path is the endpoint the server serves.
func (s *Server) Path() string {
	if s.expect.Mode == "lease" {
		return "/v1/sys/leases/renew"
	}
	return "/v1/auth/token/renew-self"
}

// SetTTL changes the TTL granted from now on (0 grants none).
func (s *Server) SetTTL(ttl int) { s.mu.Lock(); s.ttl, s.status = ttl, 0; s.mu.Unlock() }

// Fail makes every renewal from now on answer status with message, as
// OpenBao does for a revoked token or an expired lease.
func (s *Server) Fail(status int, message string) {
	s.mu.Lock()
	s.status, s.message = status, message
	s.mu.Unlock()
}

// OnRenew registers f to run inside each accepted renewal, before it is
// answered (to observe what the caller did before renewing).
func (s *Server) OnRenew(f func()) { s.mu.Lock(); s.onRenew = f; s.mu.Unlock() }

// Calls returns the number of requests received, expected or not.
func (s *Server) Calls() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

// WriteCACert writes the server's certificate as a PEM CA bundle in dir and
// returns its path.
func (s *Server) WriteCACert(dir string) (string, error) {
	p := filepath.Join(dir, "openbao-ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	return p, os.WriteFile(p, pemBytes, 0o644)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls++
	ttl, status, message, onRenew := s.ttl, s.status, s.message, s.onRenew
	s.mu.Unlock()
	if err := s.check(r); err != nil {
		s.t.Errorf("baotest: unexpected request %s %s: %v", r.Method, r.URL.Path, err)
		writeJSON(w, http.StatusNotFound, map[string]any{"errors": []string{err.Error()}})
		return
	}
	if onRenew != nil {
		onRenew()
	}
	if status != 0 {
		writeJSON(w, status, map[string]any{"errors": []string{message}})
		return
	}
	writeJSON(w, http.StatusOK, s.response(ttl))
}

// check accepts only the expected method, path, token and exact body.
func (s *Server) check(r *http.Request) error {
	if r.Method != http.MethodPut || r.URL.Path != s.Path() || r.URL.RawQuery != "" {
		return fmt.Errorf("only PUT %s is served", s.Path())
	}
	if got := r.Header.Get("X-Vault-Token"); got != s.expect.Token {
		return fmt.Errorf("X-Vault-Token %q is not the configured token", got)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		return err
	}
	var got map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		return fmt.Errorf("body %q: %v", body, err)
	}
	want := map[string]any{"increment": json.Number(fmt.Sprint(s.expect.Increment))}
	if s.expect.Mode == "lease" {
		want["lease_id"] = s.expect.LeaseID
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("body %s, want %v", body, want)
	}
	return nil
}

func (s *Server) response(ttl int) map[string]any {
	if s.expect.Mode == "lease" {
		return map[string]any{"request_id": "baotest", "lease_id": s.expect.LeaseID,
			"renewable": true, "lease_duration": ttl, "data": nil, "warnings": nil}
	}
	return map[string]any{"request_id": "baotest", "lease_id": "", "renewable": false,
		"lease_duration": 0, "data": nil, "warnings": nil,
		"auth": map[string]any{"client_token": s.expect.Token, "accessor": "baotest",
			"policies": []string{"default", "tether-coordinator"}, "token_policies": []string{"default", "tether-coordinator"},
			"lease_duration": ttl, "renewable": true, "orphan": true}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
