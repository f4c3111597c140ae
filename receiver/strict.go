package receiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"
)

// decodeStrictInto decodes data, exactly one JSON object, into v (a
// pointer to a struct). Beyond encoding/json it refuses invalid UTF-8,
// keys that are not a field's exact name (encoding/json folds case),
// duplicate keys (encoding/json keeps the last), nesting beyond 32 levels,
// unknown fields and trailing data.
func decodeStrictInto(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errors.New("invalid UTF-8")
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return errors.New("not a JSON object")
	}
	w := keyWalker{dec: json.NewDecoder(bytes.NewReader(trimmed))}
	w.dec.UseNumber()
	if err := w.value(reflect.TypeOf(v), 0); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the object")
	}
	return nil
}

// keyWalker checks object keys against the Go type being decoded.
type keyWalker struct{ dec *json.Decoder }

const maxJSONDepth = 32

func (w keyWalker) value(t reflect.Type, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("nesting deeper than %d", maxJSONDepth)
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return w.object(t, depth)
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for w.dec.More() {
			if err := w.value(elem, depth+1); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return err
	}
	return nil
}

func (w keyWalker) object(t reflect.Type, depth int) error {
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string)
		if seen[key] {
			return fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var ft reflect.Type
		switch {
		case t != nil && t.Kind() == reflect.Struct:
			if ft = fieldType(t, key); ft == nil {
				return fmt.Errorf("unknown field %q", key)
			}
		case t != nil && t.Kind() == reflect.Map:
			ft = t.Elem()
		}
		if err := w.value(ft, depth+1); err != nil {
			return err
		}
	}
	_, err := w.dec.Token()
	return err
}

// fieldType returns the type of the field whose JSON name is exactly key.
func fieldType(t reflect.Type, key string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f.Type
		}
	}
	return nil
}
