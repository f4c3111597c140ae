package httpserver

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// FuzzDecodeCreate: whatever the body, decoding never panics, answers
// only bad_request or too_large when it refuses, and what it admits is
// inside every wire bound and reads the same after a round trip (one
// reading). Seeds in testdata/fuzz/FuzzDecodeCreate.
func FuzzDecodeCreate(f *testing.F) {
	f.Add([]byte(`{"limits":{"memory_bytes":1048576},"lease_ttl_s":60,"labels":{"a":"b"}}`))
	f.Add([]byte(`{"lease_ttl_s":60,"lease_ttl_s":61}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := decodeCreate(bytes.NewReader(body), MaxBodyBytes)
		if e != nil {
			if e.Code != api.CodeBadRequest && e.Code != api.CodeTooLarge {
				t.Fatalf("refusal code %q", e.Code)
			}
			return
		}
		if c := checkCreate(req); c != nil {
			t.Fatalf("admitted a body its own check refuses: %v", c)
		}
		again, e := decodeCreate(bytes.NewReader(mustJSON(t, req)), MaxBodyBytes)
		if e != nil || !bytes.Equal(mustJSON(t, again), mustJSON(t, req)) {
			t.Fatalf("round trip of %q: %v", body, e)
		}
	})
}

// FuzzDecodeRenew: the same for a renew body; an admitted TTL is 1 s to
// the maximum.
func FuzzDecodeRenew(f *testing.F) {
	f.Add([]byte(`{"lease_ttl_s":60}`))
	f.Add([]byte(`{"lease_ttl_s":0}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := decodeRenew(bytes.NewReader(body), MaxBodyBytes)
		if e != nil {
			if e.Code != api.CodeBadRequest && e.Code != api.CodeTooLarge {
				t.Fatalf("refusal code %q", e.Code)
			}
			return
		}
		if req.LeaseTTLSeconds < 1 || req.LeaseTTLSeconds > MaxLeaseTTLSeconds {
			t.Fatalf("admitted ttl %d", req.LeaseTTLSeconds)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzTransferQuery: whatever the query string, an import's and a
// copy's parameters are refused only with bad_request, and what is
// admitted is a lowercase hex digest with create fields inside every
// wire bound, or an absolute NUL-free path of at most maxPathBytes.
// Seeds in testdata/fuzz/FuzzTransferQuery.
func FuzzTransferQuery(f *testing.F) {
	f.Add("sha256=" + strings.Repeat("ab", 32) + "&lease_ttl_s=60&disk_bytes=134217728")
	f.Add("path=%2Fwork%2Fproj")
	f.Add("sha256=x&sha256=y&path=a%00b")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		req, want, e := importParams(q)
		switch {
		case e != nil && e.Code != api.CodeBadRequest:
			t.Fatalf("import refusal code %q", e.Code)
		case e == nil && (!digestPattern.MatchString(want) || checkCreate(req) != nil):
			t.Fatalf("admitted import %q: %+v %q", raw, req, want)
		}
		p, e := pathParam(q)
		switch {
		case e != nil && e.Code != api.CodeBadRequest:
			t.Fatalf("path refusal code %q", e.Code)
		case e == nil && (!strings.HasPrefix(p, "/") || len(p) > maxPathBytes || strings.ContainsRune(p, 0)):
			t.Fatalf("admitted path %q", p)
		}
	})
}
