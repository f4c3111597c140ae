package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

type inner struct {
	A string `json:"a"`
}

type outer struct {
	inner
	Name  string            `json:"name"`
	Items []inner           `json:"items"`
	Env   map[string]string `json:"env"`
	Raw   json.RawMessage   `json:"raw"`
	Any   any               `json:"any"`
}

func nest(n int) string { return strings.Repeat(`{"any":`, n-1) + `{}` + strings.Repeat(`}`, n-1) }

// TestDecodeRefuses attacks each check; each case names the sentinel it
// must hit, so a check removed (or another one catching it first) fails.
func TestDecodeRefuses(t *testing.T) {
	cases := []struct {
		name, in string
		want     error
	}{
		{"duplicate key", `{"name":"x","name":"y"}`, ErrDuplicateKey},
		{"duplicate via escape", `{"a":"x","\u0061":"y"}`, ErrDuplicateKey},
		{"duplicate via escaped quote", `{"name":"x","n\u0061me":"y"}`, ErrDuplicateKey},
		{"duplicate promoted field", `{"a":"x","a":"y"}`, ErrDuplicateKey},
		{"duplicate in array element", `{"items":[{"a":"1"},{"a":"1","a":"2"}]}`, ErrDuplicateKey},
		{"duplicate in map", `{"env":{"PATH":"/bin","PATH":"/tmp"}}`, ErrDuplicateKey},
		{"duplicate inside RawMessage", `{"raw":{"k":1,"k":2}}`, ErrDuplicateKey},
		{"duplicate inside any, deep", `{"any":[[{"x":{"k":1,"\u006b":2}}]]}`, ErrDuplicateKey},
		{"lone surrogates fold to one key", `{"env":{"\ud800":"1","\udbff":"2"}}`, ErrDuplicateKey},
		{"unknown field", `{"name":"x","extra":1}`, ErrUnknownField},
		{"unknown nested field", `{"items":[{"a":"1","b":2}]}`, ErrUnknownField},
		{"case-folded key", `{"NAME":"x"}`, ErrUnknownField},
		{"case-folded promoted key", `{"A":"x"}`, ErrUnknownField},
		{"unexported embedded type name", `{"inner":{}}`, ErrUnknownField},
		{"too deep", nest(MaxDepth + 1), ErrTooDeep},
		{"too deep in arrays", `{"any":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, ErrTooDeep},
		{"trailing object", `{"name":"x"}{}`, ErrTrailingData},
		{"trailing garbage", `{"name":"x"} x`, ErrTrailingData},
		{"trailing comma value", `{"name":"x"},`, ErrTrailingData},
		{"array at top", `[{"name":"x"}]`, ErrSyntax},
		{"null at top", `null`, ErrSyntax},
		{"empty", ``, ErrSyntax},
		{"invalid UTF-8", "{\"name\":\"\xff\"}", ErrSyntax},
		{"unterminated", `{"name":"x"`, ErrSyntax},
		{"bad escape in key", `{"n\qme":"x"}`, ErrSyntax},
		{"wrong type", `{"name":1}`, ErrType},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v outer
			err := Decode([]byte(c.in), 1<<10, &v)
			if !errors.Is(err, c.want) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode(%s) = %v, want %v wrapped with ErrInvalid", c.in, err, c.want)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	in := ` {"a":"promoted","name":"n\u0061me","items":[{"a":"1"},{"a":"2"}],"env":{"A":"1","B":"2"},` +
		`"raw":{"x":[1,{"y":null}]},"any":` + nest(MaxDepth-1) + `} ` + "\n"
	var v outer
	if err := Decode([]byte(in), len(in), &v); err != nil {
		t.Fatal(err)
	}
	if v.A != "promoted" || v.Name != "name" || len(v.Items) != 2 || v.Env["B"] != "2" || string(v.Raw) != `{"x":[1,{"y":null}]}` {
		t.Fatalf("decoded %+v", v)
	}
}

func TestDecodeSizeLimit(t *testing.T) {
	in := []byte(`{"name":"0123456789"}`)
	var v outer
	if err := Decode(in, len(in), &v); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	for _, limit := range []int{len(in) - 1, 0, -1} {
		if err := Decode(in, limit, &v); !errors.Is(err, ErrTooLarge) {
			t.Errorf("limit %d: err = %v, want ErrTooLarge", limit, err)
		}
	}
	if err := Read(strings.NewReader(string(in)+"   "), len(in), &v); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Read past the limit: err = %v, want ErrTooLarge", err)
	}
	if err := Read(strings.NewReader(string(in)), len(in), &v); err != nil || v.Name != "0123456789" {
		t.Errorf("Read at the limit: %v, %+v", err, v)
	}
}

func TestDecodeTarget(t *testing.T) {
	var v outer
	for _, target := range []any{v, nil, (*outer)(nil)} {
		if err := Decode([]byte(`{}`), 10, target); !errors.Is(err, ErrType) {
			t.Errorf("target %T: err = %v, want ErrType", target, err)
		}
	}
}

// TestErrorNamesCheckAndPath: the message names the failed check and
// where, so an operator reading a refusal knows which key to fix.
func TestErrorNamesCheckAndPath(t *testing.T) {
	var v outer
	err := Decode([]byte(`{"items":[{"a":"1"},{"a":"1","a":"2"}]}`), 100, &v)
	if got := err.Error(); got != `strict json: duplicate key "a" at ".items[1]"` {
		t.Fatalf("message %q", got)
	}
}

type dominance struct {
	L1
	L2
	Own string `json:"own"`
}
type L1 struct {
	Q string
	Y string
	Z string `json:"z"`
}
type L2 struct {
	Q string
	Y string `json:"y"`
	deep
}
type deep struct {
	Z string `json:"z"`
	W string `json:"w"`
}

// TestEmbeddedFieldsAsEncodingJSON: promoted names follow encoding/json's
// rules (a tie at one depth drops the name, a tag breaks it, shallower
// wins), so a key decodes into the same field as with encoding/json, and
// a dropped name is refused rather than silently ignored.
func TestEmbeddedFieldsAsEncodingJSON(t *testing.T) {
	for _, key := range []string{"Q", "q"} {
		var v dominance
		if err := Decode([]byte(`{"`+key+`":"1"}`), 100, &v); !errors.Is(err, ErrUnknownField) {
			t.Errorf("ambiguous %q: err = %v, want ErrUnknownField", key, err)
		}
	}
	in := `{"Y":"a","y":"b","z":"c","w":"d","own":"e"}`
	var strict, plain dominance
	if err := Decode([]byte(in), 100, &strict); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(in), &plain); err != nil {
		t.Fatal(err)
	}
	if strict != plain || strict.L1.Y != "a" || strict.L2.Y != "b" || strict.L1.Z != "c" || strict.W != "d" {
		t.Fatalf("strict %+v, encoding/json %+v", strict, plain)
	}
}

// TestDecodeWithRaw: the named top-level member comes back as its bytes
// and is not decoded; the rest decodes as Decode would; the strict checks
// still cover the whole document, the raw member included (duplicate keys
// inside it, a second member of the same name, unknown fields outside).
func TestDecodeWithRaw(t *testing.T) {
	type env struct {
		ID   uint64          `json:"id"`
		Args json.RawMessage `json:"args"`
		Op   string          `json:"op"`
	}
	var e env
	raw, err := DecodeWithRaw([]byte(`{"id":7, "args" : {"a":[1,2,{"b":"}"}]} ,"op":"x"}`), 100, &e, "args")
	if err != nil || string(raw) != `{"a":[1,2,{"b":"}"}]}` || e.ID != 7 || e.Op != "x" || string(e.Args) != "null" {
		t.Fatalf("raw %q, env %+v, err %v", raw, e, err)
	}
	raw, err = DecodeWithRaw([]byte(`{"id":1,"op":"y"}`), 100, &e, "args")
	if err != nil || raw != nil {
		t.Fatalf("absent member: raw %q, err %v", raw, err)
	}
	for _, bad := range []string{
		`{"id":1,"args":{"a":1,"a":2}}`,
		`{"id":1,"args":1,"args":2}`,
		`{"id":1,"args":1,"extra":2}`,
		`{"id":"1","args":1}`,
		`{"id":1,"args":1} x`,
	} {
		if _, err := DecodeWithRaw([]byte(bad), 100, &e, "args"); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: accepted (%v)", bad, err)
		}
	}
	if _, err := DecodeWithRaw([]byte(`{"id":1}`), 3, &e, "args"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the size limit: %v", err)
	}
}
