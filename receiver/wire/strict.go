package wire

import (
	"encoding/json"
	"errors"
	"fmt"
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
	// The scan admitted exactly the struct's own field names, so plain
	// Unmarshal (which also refuses trailing data) decodes no more.
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// checkStrict scans data against type t and reports the first key that
// is duplicated or not an exact field name, nesting deeper than maxDepth,
// or anything after the one top-level object.
func checkStrict(data []byte, t reflect.Type) error {
	if !utf8.Valid(data) {
		return errors.New("invalid UTF-8")
	}
	s := scanner{b: data}
	s.ws()
	if s.i >= len(data) || data[s.i] != '{' {
		return errors.New("not a JSON object")
	}
	if err := s.value(t, ""); err != nil {
		return err
	}
	if s.ws(); s.i != len(data) {
		return errors.New("trailing data after the object")
	}
	return nil
}

// scanner checks the structure of one JSON text without decoding values:
// it finds every object key (unescaped as encoding/json would) and the
// nesting depth. Values are only skipped; json.Unmarshal validates them
// afterwards, so the scanner must be exact only on input encoding/json
// accepts. strict_ref_test.go holds a tokenizer-based reference, and
// FuzzStrictScanner checks the two agree.
type scanner struct {
	b     []byte
	i     int
	depth int
}

var errSyntax = errors.New("JSON syntax error")

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value skips one value; t is the Go type it decodes into, or nil when
// only key uniqueness can be checked (json.RawMessage, any).
func (s *scanner) value(t reflect.Type, path string) error {
	s.ws()
	if s.i >= len(s.b) {
		return errSyntax
	}
	switch s.b[s.i] {
	case '{', '[':
		if s.depth++; s.depth > maxDepth {
			return fmt.Errorf("at %q: nesting deeper than %d", path, maxDepth)
		}
		defer func() { s.depth-- }()
		if s.b[s.i] == '{' {
			return s.object(t, path)
		}
		return s.array(elemType(t), path)
	case '"':
		_, _, err := s.str()
		return err
	}
	start := s.i
	for s.i < len(s.b) && !isDelim(s.b[s.i]) {
		s.i++
	}
	if s.i == start {
		return errSyntax
	}
	return nil
}

// isDelim reports the bytes that end a literal (number, true, false, null).
func isDelim(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r', '{', '[', '"', ':':
		return true
	}
	return false
}

// str skips a string and returns its raw body and whether it has escapes.
func (s *scanner) str() ([]byte, bool, error) {
	s.i++ // opening quote
	start, esc := s.i, false
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], esc, nil
		case c == '\\':
			esc = true
			s.i += 2
		case c < 0x20:
			return nil, false, errSyntax
		default:
			s.i++
		}
	}
	return nil, false, errSyntax
}

// key reads an object key as encoding/json sees it.
func (s *scanner) key() (string, error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return "", errSyntax
	}
	start := s.i
	raw, esc, err := s.str()
	if err != nil || !esc {
		return string(raw), err
	}
	var k string
	if err := json.Unmarshal(s.b[start:s.i], &k); err != nil {
		return "", errSyntax
	}
	return k, nil
}

// expect consumes c after optional whitespace.
func (s *scanner) expect(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) array(t reflect.Type, path string) error {
	s.i++ // '['
	if s.expect(']') {
		return nil
	}
	for n := 0; ; n++ {
		if err := s.value(t, fmt.Sprintf("%s[%d]", path, n)); err != nil {
			return err
		}
		if s.expect(']') {
			return nil
		}
		if !s.expect(',') {
			return errSyntax
		}
	}
}

func (s *scanner) object(t reflect.Type, path string) error {
	s.i++ // '{'
	if s.expect('}') {
		return nil
	}
	t = deref(t)
	var fields map[string]reflect.Type
	if t != nil && t.Kind() == reflect.Struct {
		fields = structFields(t)
	}
	seen := make(map[string]struct{}, 8)
	for {
		key, err := s.key()
		if err != nil {
			return err
		}
		if _, dup := seen[key]; dup {
			return fmt.Errorf("at %q: duplicate key %q", path, key)
		}
		seen[key] = struct{}{}
		next, err := fieldType(t, fields, key, path)
		if err != nil {
			return err
		}
		if !s.expect(':') {
			return errSyntax
		}
		if err := s.value(next, path+"."+key); err != nil {
			return err
		}
		if s.expect('}') {
			return nil
		}
		if !s.expect(',') {
			return errSyntax
		}
	}
}

// fieldType is the type a key's value decodes into: the exact field of a
// struct (any other key is refused), a map's element type, or nil.
func fieldType(t reflect.Type, fields map[string]reflect.Type, key, path string) (reflect.Type, error) {
	switch {
	case fields != nil:
		ft, ok := fields[key]
		if !ok {
			return nil, fmt.Errorf("at %q: unknown field %q", path, key)
		}
		return ft, nil
	case t != nil && t.Kind() == reflect.Map:
		return t.Elem(), nil
	}
	return nil, nil
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
