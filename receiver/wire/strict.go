package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"
)

// maxDepth bounds JSON nesting in any frame; the deepest legitimate shape
// (a request envelope holding exec_start args with an env map) is 3.
const maxDepth = 16

// decodeStrict decodes data, which must be exactly one JSON object, into v
// (a pointer to a struct). Beyond encoding/json's defaults it refuses
// invalid UTF-8 (which encoding/json would silently replace), keys that do
// not match a field name exactly (encoding/json matches case-insensitively),
// duplicate keys in any object (encoding/json keeps the last), unknown
// fields, nesting deeper than maxDepth, and trailing data. Every failure
// wraps ErrMalformed.
func decodeStrict(data []byte, v any) error {
	if err := checkStrict(data, reflect.TypeOf(v)); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data after the object", ErrMalformed)
	}
	return nil
}

// checkStrict walks the JSON tokens of data against type t and reports the
// first key that is duplicated, not an exact field name, or too deep.
func checkStrict(data []byte, t reflect.Type) error {
	if !utf8.Valid(data) {
		return errors.New("invalid UTF-8")
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	return w.value(t, "")
}

type walker struct {
	dec   *json.Decoder
	depth int
}

// value consumes one JSON value; t is the Go type it decodes into, or nil
// when only key uniqueness can be checked (json.RawMessage, any).
func (w *walker) value(t reflect.Type, path string) error {
	tok, err := w.dec.Token()
	if err != nil {
		return fmt.Errorf("at %q: %w", path, err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if w.depth++; w.depth > maxDepth {
		return fmt.Errorf("at %q: nesting deeper than %d", path, maxDepth)
	}
	defer func() { w.depth-- }()
	if d == '[' {
		return w.array(elemType(t), path)
	}
	return w.object(t, path)
}

func (w *walker) array(t reflect.Type, path string) error {
	for i := 0; w.dec.More(); i++ {
		if err := w.value(t, fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // ']'
	return err
}

func (w *walker) object(t reflect.Type, path string) error {
	t = deref(t)
	var fields map[string]reflect.Type
	if t != nil && t.Kind() == reflect.Struct {
		fields = structFields(t)
	}
	seen := make(map[string]struct{})
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return fmt.Errorf("at %q: %w", path, err)
		}
		key := tok.(string) // the decoder only yields string keys in an object
		if _, dup := seen[key]; dup {
			return fmt.Errorf("at %q: duplicate key %q", path, key)
		}
		seen[key] = struct{}{}
		var next reflect.Type
		switch {
		case fields != nil:
			ft, ok := fields[key]
			if !ok {
				return fmt.Errorf("at %q: unknown field %q", path, key)
			}
			next = ft
		case t != nil && t.Kind() == reflect.Map:
			next = t.Elem()
		}
		if err := w.value(next, path+"."+key); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return err
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// deref strips pointers; json.RawMessage and interfaces become nil (shape
// unknown here, decoded strictly later or never).
func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t == rawMessageType || t.Kind() == reflect.Interface {
		return nil
	}
	return t
}

func elemType(t reflect.Type) reflect.Type {
	t = deref(t)
	if t == nil || (t.Kind() != reflect.Slice && t.Kind() != reflect.Array) {
		return nil
	}
	return t.Elem()
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// structFields maps the exact JSON name of each exported field of t to its
// type. The wire structs have no embedded fields.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}
