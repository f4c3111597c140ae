package httpserver

import (
	"bytes"
	"encoding/json"
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
