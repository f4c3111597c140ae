package image

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeManifest: DecodeManifest never panics, and what it accepts
// validates and names a plain image file.
func FuzzDecodeManifest(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.json")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest(data)
		if err != nil {
			if !errors.Is(err, ErrManifest) {
				t.Fatalf("error %v does not wrap ErrManifest", err)
			}
			return
		}
		if m.Validate() != nil || filepath.Base(m.Image) != m.Image {
			t.Fatalf("accepted %+v", m)
		}
	})
}
