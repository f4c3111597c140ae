package acpmeta

import (
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkOpFromMeta: the op tag of every callback, decoded as the SDK
// hands it over (a map), against the strict re-encode-and-decode it
// replaced on the hot path (same run).
func BenchmarkOpFromMeta(b *testing.B) {
	var meta map[string]any
	raw := `{"tether/op":{"tuple_sha256":"` + strings.Repeat("a", 64) + `","op_key":"op-1:create","deadline":"2030-01-01T00:00:00Z"}}`
	if err := json.Unmarshal([]byte(raw), &meta); err != nil {
		b.Fatal(err)
	}
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			if _, err := OpFromMeta(meta); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("remarshal", func(b *testing.B) {
		for b.Loop() {
			var o Op
			if err := remarshal(meta[KeyOp], &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}
