package acpmeta

import (
	"encoding/json"
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
