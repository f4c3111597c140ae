package acpmeta

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzMeta decodes arbitrary `_meta` JSON with every parser of the
// contract: each either refuses it or returns a value its own validation
// accepts.
func FuzzMeta(f *testing.F) {
	f.Add([]byte(`{"tether/op":{"tuple_sha256":"` + string(make([]byte, 0)) + `","op_key":"k","deadline":"2030-01-01T00:00:00Z"}}`))
	f.Add([]byte(`{"tether/verify":{"files":{"a/b":"0000000000000000000000000000000000000000000000000000000000000000"}}}`))
	f.Add([]byte(`{"tether/bind":{"tuple":{"owner":"o"},"lease_not_after":"2030-01-01T00:00:00Z"}}`))
	f.Add([]byte(`{"tether/expect":{"absent":true},"tether/file":{"sha256":"x","size":-1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var meta map[string]any
		if json.Unmarshal(data, &meta) != nil {
			return
		}
		if o, err := OpFromMeta(meta); err == nil && (!ValidDigest(o.TupleSHA256) || !ValidOpKey(o.OpKey) || o.Deadline.IsZero()) {
			t.Fatalf("OpFromMeta accepted %+v", o)
		}
		if v, ok, err := VerifyFromMeta(meta); ok && err == nil && v.Validate() != nil {
			t.Fatalf("VerifyFromMeta accepted %+v", v)
		}
		if b, ok, err := BindFromMeta(meta); ok && err == nil && b.Tuple.Validate() != nil {
			t.Fatalf("BindFromMeta accepted %+v", b)
		}
		if e, ok, err := ExpectFromMeta(meta); ok && err == nil && e.Validate() != nil {
			t.Fatalf("ExpectFromMeta accepted %+v", e)
		}
		if fm, ok, err := FileFromMeta(meta); ok && err == nil && (!ValidDigest(fm.SHA256) || fm.Size < 0) {
			t.Fatalf("FileFromMeta accepted %+v", fm)
		}
	})
}

// FuzzOpFast: the op tag's fast decoder agrees with the strict one
// (remarshal) on every input it takes, and leaves the rest to it.
func FuzzOpFast(f *testing.F) {
	f.Add([]byte(`{"tuple_sha256":"` + strings.Repeat("a", 64) + `","op_key":"k","deadline":"2030-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"Op_Key":"k"}`))
	f.Add([]byte(`{"op_key":"k","deadline":"2030-01-01T00:00:00.5+01:00"}`))
	f.Add([]byte(`{"op_key":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var raw any
		if json.Unmarshal(data, &raw) != nil {
			return
		}
		fast, ok := opFast(raw)
		if !ok {
			return
		}
		var strict Op
		if err := remarshal(raw, &strict); err != nil {
			t.Fatalf("fast decoder took %s, strict decoding refuses it: %v", data, err)
		}
		if fast.TupleSHA256 != strict.TupleSHA256 || fast.OpKey != strict.OpKey || !fast.Deadline.Equal(strict.Deadline) ||
			fast.Deadline.String() != strict.Deadline.String() {
			t.Fatalf("fast %+v, strict %+v for %s", fast, strict, data)
		}
	})
}
