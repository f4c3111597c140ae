package strictjson

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// Seed corpus: testdata/fuzz/FuzzDecode (duplicate keys at each depth,
// keys equal after unescaping, deep nesting, trailing data, unknown and
// case-folded fields, invalid UTF-8). Run the fuzzer with
//   go test ./admission/strictjson -run '^$' -fuzz '^FuzzDecode$' -fuzztime 30s

type fuzzItem struct {
	ID   int    `json:"id"`
	Note string `json:"note,omitempty"`
}

type fuzzBase struct {
	Owner string `json:"owner"`
}

// fuzzDoc has a field of every kind the scanner treats differently.
type fuzzDoc struct {
	fuzzBase
	Name  string            `json:"name"`
	N     int64             `json:"n"`
	Tags  map[string]string `json:"tags"`
	Items []fuzzItem        `json:"items"`
	Ptr   *fuzzItem         `json:"ptr"`
	Raw   json.RawMessage   `json:"raw"`
	Any   any               `json:"any"`
	When  time.Time         `json:"when"`
	Plain bool
	Skip  string `json:"-"`
}

// FuzzDecode is the one fuzz target of the strict decoder. For each input
// and target type: the fast scanner agrees with the tokenizer reference;
// Decode never accepts what encoding/json refuses, and what it accepts
// decodes to exactly what plain encoding/json decodes (one reading); every
// refusal is an *Error wrapping ErrInvalid and its check.
func FuzzDecode(f *testing.F) {
	targets := []func() any{
		func() any { return new(fuzzDoc) },
		func() any { return new(map[string]any) },
		func() any { return new(fuzzItem) },
	}
	f.Fuzz(func(t *testing.T, which uint8, in []byte) {
		mk := targets[int(which)%len(targets)]
		v := mk()
		err := Decode(in, 1<<20, v)
		ref := refCheck(in, reflect.TypeOf(v))
		plain := mk()
		plainErr := json.Unmarshal(in, plain)
		if err != nil {
			var se *Error
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalid) || !errors.Is(err, se.Check) {
				t.Fatalf("refusal %v is not an *Error wrapping ErrInvalid and its check", err)
			}
			if ref == nil && plainErr == nil && json.Valid(in) {
				t.Fatalf("%T on %q: refused (%v) what the reference and encoding/json accept", v, in, err)
			}
			return
		}
		if ref != nil {
			t.Fatalf("%T on %q: accepted what the reference refuses: %v", v, in, ref)
		}
		if plainErr != nil {
			t.Fatalf("%T on %q: accepted what encoding/json refuses: %v", v, in, plainErr)
		}
		if !reflect.DeepEqual(v, plain) {
			t.Fatalf("%T on %q: strict %+v, plain %+v", v, in, v, plain)
		}
		checkWithRaw(t, in, v)
	})
}

// checkWithRaw: on what Decode accepted into a fuzzDoc, DecodeWithRaw of
// the "raw" member accepts too, returns exactly the bytes Decode kept in
// Raw, and decodes every other field as Decode did.
func checkWithRaw(t *testing.T, in []byte, decoded any) {
	want, ok := decoded.(*fuzzDoc)
	if !ok {
		return
	}
	var got fuzzDoc
	raw, err := DecodeWithRaw(in, 1<<20, &got, "raw")
	if err != nil {
		t.Fatalf("DecodeWithRaw refused %q, which Decode accepted: %v", in, err)
	}
	if string(raw) != string(want.Raw) && !(raw == nil && want.Raw == nil) {
		t.Fatalf("DecodeWithRaw on %q: raw %q, Decode kept %q", in, raw, want.Raw)
	}
	w := *want
	w.Raw, got.Raw = nil, nil
	if !reflect.DeepEqual(w, got) {
		t.Fatalf("DecodeWithRaw on %q: %+v, Decode %+v", in, got, w)
	}
}
