package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"unicode/utf8"
)

// refCheck is the reference for check: the same rules, walked with
// encoding/json's own tokenizer (simple to trust, slow and allocating).
// FuzzDecode checks that the production scanner agrees with it.
func refCheck(data []byte, t reflect.Type) error {
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
	if err := w.value(t, ""); err != nil {
		return err
	}
	if _, err := dec.Token(); err == nil {
		return errors.New("trailing data")
	}
	return nil
}

type walker struct {
	dec   *json.Decoder
	depth int
}

// value consumes one JSON value; t is the Go type it decodes into, or nil
// when only key uniqueness can be checked.
func (w *walker) value(t reflect.Type, path string) error {
	tok, err := w.dec.Token()
	if err != nil {
		return fmt.Errorf("at %q: %w", path, err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if w.depth++; w.depth > MaxDepth {
		return fmt.Errorf("at %q: nesting deeper than %d", path, MaxDepth)
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
		next, err := fieldType(t, fields, key, path)
		if err != nil {
			return err
		}
		if err := w.value(next, path+"."+key); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return err
}
