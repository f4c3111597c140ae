package auditlog

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzVerify: verification never panics and fails only with ErrChain or
// ErrCheckpoint.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"seq":1,"time":"2026-12-01T10:00:00Z","kind":"pause","actor":"a","prev":"0000000000000000000000000000000000000000000000000000000000000000"}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := Verify(bytes.NewReader(b), nil)
		if err != nil && !errors.Is(err, ErrChain) {
			t.Fatal(err)
		}
	})
}
