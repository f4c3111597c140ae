package baotest

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// recorder records Errorf instead of failing, so the test can prove the
// fake fails the test it serves.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.errs) }

func TestServerFailsTheTestOnAnyOtherRequest(t *testing.T) {
	rec := &recorder{TB: t}
	s, err := NewServer(rec, Expect{Token: "tok", Mode: "token", Increment: 60}, 30)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}}
	do := func(method, path, tok, body string) int {
		req, _ := http.NewRequest(method, s.URL+path, bytes.NewBufferString(body))
		if tok != "" {
			req.Header.Set("X-Vault-Token", tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do("PUT", "/v1/auth/token/renew-self", "tok", `{"increment":60}`); code != 200 || rec.count() != 0 {
		t.Fatalf("the expected request: %d, errors %v", code, rec.errs)
	}
	unexpected := []struct{ method, path, tok, body string }{
		{"GET", "/v1/auth/token/renew-self", "tok", `{"increment":60}`},
		{"PUT", "/v1/sys/leases/renew", "tok", `{"increment":60}`},
		{"PUT", "/v1/auth/token/lookup-self", "tok", `{}`},
		{"PUT", "/v1/auth/token/renew-self", "other", `{"increment":60}`},
		{"PUT", "/v1/auth/token/renew-self", "", `{"increment":60}`},
		{"PUT", "/v1/auth/token/renew-self", "tok", `{"increment":61}`},
		{"PUT", "/v1/auth/token/renew-self", "tok", `{"increment":60,"x":1}`},
		{"PUT", "/v1/auth/token/renew-self?x=1", "tok", `{"increment":60}`},
	}
	for i, u := range unexpected {
		if code := do(u.method, u.path, u.tok, u.body); code != 404 || rec.count() != i+1 {
			t.Errorf("%+v: status %d, %d recorded failures; want 404 and a failed test", u, code, rec.count())
		}
	}
	if s.Calls() != len(unexpected)+1 {
		t.Errorf("Calls = %d", s.Calls())
	}
}
