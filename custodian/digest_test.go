package custodian

import (
	"reflect"
	"testing"

	"github.com/tetherdev/tether/receiver/wire"
)

// TestWriteDigestCoversEveryArg: a write's request digest stands the
// content's SHA-256 in for its text; changing any field of the write's
// args (including one added to wire.WriteArgs later) must change it, or a
// different write would replay another's receipt.
func TestWriteDigestCoversEveryArg(t *testing.T) {
	base := wire.WriteArgs{Path: "a.txt", Content: "v1", Mode: 0o644, ExpectSHA256: sha256Hex([]byte("v0"))}
	digestOf := func(a wire.WriteArgs) string {
		d, err := requestDigest("fs/write_text_file", "s", "t", wire.OpWrite, writeDigestArgs(&a, sha256Hex([]byte(a.Content))), nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	ref := digestOf(base)
	v := reflect.ValueOf(base)
	for i := range v.NumField() {
		changed := base
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Uint32:
			f.SetUint(f.Uint() + 1)
		case reflect.Bool:
			f.SetBool(!f.Bool())
		default:
			t.Fatalf("wire.WriteArgs.%s has kind %s: extend writeDigest and this test", v.Type().Field(i).Name, f.Kind())
		}
		if digestOf(changed) == ref {
			t.Errorf("changing wire.WriteArgs.%s leaves the request digest unchanged", v.Type().Field(i).Name)
		}
	}
}
