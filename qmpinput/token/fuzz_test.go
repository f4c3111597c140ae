package token

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzSecret: parsing a link never panics and accepts only the minted shape.
func FuzzSecret(f *testing.F) {
	f.Add("0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("0123456789abcdef.")
	f.Add("..")
	f.Fuzz(func(t *testing.T, s string) {
		id, _, err := Secret(s).parse()
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatal(err)
			}
			return
		}
		if len(id) != 16 || len(s) != 16+1+43 {
			t.Fatalf("accepted %q", s)
		}
	})
}

// FuzzDecodeFile: the token file decoder never panics, and what it
// accepts re-encodes to a file it accepts again.
func FuzzDecodeFile(f *testing.F) {
	f.Add([]byte(`{"version":1,"tokens":[]}`))
	f.Add([]byte(`{"version":1,"tokens":[{"id":"0123456789abcdef","role":"view","created":"2026-12-01T10:00:00Z","expires":"2026-12-01T11:00:00Z","secret_sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrStore) {
				t.Fatal(err)
			}
			return
		}
		again, _ := json.Marshal(fl)
		if _, err := decode(again); err != nil {
			t.Fatalf("accepted %q but not its re-encoding: %v", b, err)
		}
	})
}
