package strictjson

import (
	"encoding/json"
	"reflect"
	"strconv"
	"unicode/utf8"
)

// check scans data against type t and reports the first key that is
// duplicated or not an exact field name, nesting deeper than MaxDepth, or
// anything after the one top-level object.
func check(data []byte, t reflect.Type) error {
	_, _, err := checkSpan(data, t, "")
	return err
}

// checkSpan is check; it also returns where the value of the top-level
// member named key begins and ends (both -1 when key is "" or absent).
func checkSpan(data []byte, t reflect.Type, key string) (start, end int, err error) {
	s := scanner{b: data, capture: key, capStart: -1, capEnd: -1}
	err = s.check(t)
	return s.capStart, s.capEnd, err
}

func (s *scanner) check(t reflect.Type) error {
	data := s.b
	if !utf8.Valid(data) {
		return refuse(ErrSyntax, "", "invalid UTF-8")
	}
	s.ws()
	if s.i >= len(data) || data[s.i] != '{' {
		return refuse(ErrSyntax, "", "the top level is not an object")
	}
	if err := s.value(t, ""); err != nil {
		return err
	}
	if s.ws(); s.i != len(data) {
		return refuse(ErrTrailingData, "", "%d bytes after the object", len(data)-s.i)
	}
	return nil
}

// scanner checks the structure of one JSON text without decoding values:
// it finds every object key (unescaped as encoding/json would) and the
// nesting depth. Values are only skipped; json.Unmarshal validates them
// afterwards, so the scanner must be exact only on input encoding/json
// accepts. ref_test.go holds a tokenizer-based reference, and FuzzDecode
// checks the two agree.
type scanner struct {
	b     []byte
	i     int
	depth int
	// capture names a top-level member whose value's span is recorded in
	// capStart and capEnd (DecodeWithRaw).
	capture          string
	capStart, capEnd int
}

func (s *scanner) syntax(path string) error {
	return refuse(ErrSyntax, path, "unexpected input at byte %d", s.i)
}

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
// only key uniqueness and depth can be checked.
func (s *scanner) value(t reflect.Type, path string) error {
	s.ws()
	if s.i >= len(s.b) {
		return s.syntax(path)
	}
	switch s.b[s.i] {
	case '{', '[':
		if s.depth++; s.depth > MaxDepth {
			return refuse(ErrTooDeep, path, "")
		}
		defer func() { s.depth-- }()
		if s.b[s.i] == '{' {
			return s.object(t, path)
		}
		return s.array(elemType(t), path)
	case '"':
		if _, _, ok := s.str(); !ok {
			return s.syntax(path)
		}
		return nil
	}
	start := s.i
	for s.i < len(s.b) && !isDelim(s.b[s.i]) {
		s.i++
	}
	if s.i == start {
		return s.syntax(path)
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
func (s *scanner) str() (raw []byte, esc, ok bool) {
	s.i++ // opening quote
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], esc, true
		case c == '\\':
			esc = true
			s.i += 2
		case c < 0x20:
			return nil, false, false
		default:
			s.i++
		}
	}
	return nil, false, false
}

// key reads an object key as encoding/json sees it: escapes undone, so
// "\u0061" and "a" are the same key.
func (s *scanner) key(path string) (string, error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return "", s.syntax(path)
	}
	start := s.i
	raw, esc, ok := s.str()
	if !ok {
		return "", s.syntax(path)
	}
	if !esc {
		return string(raw), nil
	}
	var k string
	if err := json.Unmarshal(s.b[start:s.i], &k); err != nil {
		return "", s.syntax(path)
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
		if err := s.value(t, path+"["+strconv.Itoa(n)+"]"); err != nil {
			return err
		}
		if s.expect(']') {
			return nil
		}
		if !s.expect(',') {
			return s.syntax(path)
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
		key, err := s.key(path)
		if err != nil {
			return err
		}
		if _, dup := seen[key]; dup {
			return refuseKey(ErrDuplicateKey, path, key)
		}
		seen[key] = struct{}{}
		next, err := fieldType(t, fields, key, path)
		if err != nil {
			return err
		}
		if !s.expect(':') {
			return s.syntax(path)
		}
		capture := s.depth == 1 && s.capture != "" && key == s.capture
		if capture {
			s.ws()
			s.capStart = s.i
		}
		if err := s.value(next, path+"."+key); err != nil {
			return err
		}
		if capture {
			s.capEnd = s.i
		}
		if s.expect('}') {
			return nil
		}
		if !s.expect(',') {
			return s.syntax(path)
		}
	}
}
