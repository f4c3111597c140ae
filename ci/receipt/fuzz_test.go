package receipt

import (
	"reflect"
	"testing"
)

// FuzzDecode: Decode never panics; whatever it accepts survives an
// Encode/Decode round trip unchanged and can be checked and summarised.
func FuzzDecode(f *testing.F) {
	if b, err := Encode(good()); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			return
		}
		_ = r.Check(r.Suite)
		_ = r.Summarize()
		b, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Decode(b)
		if err != nil {
			t.Fatalf("re-decoding an encoded receipt: %v", err)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip changed the receipt")
		}
	})
}
