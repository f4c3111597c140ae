package longline

import (
	"bytes"
	"encoding/json"
	"strings"
)

// idScanner finds the id of a JSON-RPC request in one line streamed
// through it, without holding the line: a refused long line can be
// answered with its id wherever the id stands (before or after a huge
// content). It follows the top-level object only: the value of its last
// key that is "id" (matched as encoding/json matches a field name,
// case-insensitively, escapes decoded) when that value is a number or a
// string of at most maxScanID bytes, and whether a "method" key was
// seen, with its value when that is a string of at most maxScanID bytes. Bytes after the first newline are ignored. It validates nothing
// else: a line that is not JSON may still yield an id, and the answer to
// it is only a refusal of that id.
type idScanner struct {
	nl     bool // the newline was seen
	done   bool // the top-level object ended (or never began): only the newline is looked for
	broken bool // not a JSON object as far as followed: no id
	depth  int  // nesting; 1 is inside the top-level object
	inStr  bool
	esc    bool
	atKey  bool // at depth 1, the next string is a key
	inKey  bool // reading a depth-1 key
	key    []byte
	keyCut bool   // the key passed maxScanKey
	field  string // the depth-1 key whose value is being read: "id", "method" or ""
	val    []byte // the id's or method's value being read
	valCut bool   // the value passed maxScanID, or is an object or array
	found  []byte // the last complete id
	method bool
	name   string // the last method's value, when a string
}

// Bounds of what the scanner holds.
const (
	maxScanKey = 64
	maxScanID  = 1024
)

// Write scans p; it never fails.
func (s *idScanner) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && !s.nl {
		if s.done {
			s.nl = bytes.IndexByte(p, '\n') >= 0
			return n, nil
		}
		if s.inStr && !s.esc && !s.inKey && s.field == "" { // skip a string nobody reads
			i := indexStringStop(p)
			if i < 0 {
				return n, nil
			}
			p = p[i:]
		}
		s.step(p[0])
		p = p[1:]
	}
	return n, nil
}

// methodName returns the value of the message's method, when it is a
// string ("" otherwise).
func (s *idScanner) methodName() string { return s.name }

// ended reports whether the newline was seen.
func (s *idScanner) ended() bool { return s.nl }

// id returns the request's id, or nil when the line is no request (no id,
// no method, or not an object).
func (s *idScanner) id() []byte {
	if s.broken || !s.method || s.found == nil {
		return nil
	}
	return s.found
}

// step scans one byte.
func (s *idScanner) step(c byte) {
	switch {
	case c == '\n':
		s.nl = true
		s.broken = s.broken || s.depth != 0
	case s.inStr:
		s.stringByte(c)
	case c == ' ' || c == '\t' || c == '\r':
	case c == '"':
		s.inStr = true
		if s.depth == 1 && s.atKey {
			s.inKey, s.key, s.keyCut = true, s.key[:0], false
			return
		}
		s.keep(c)
	case c == '{' || c == '[':
		s.open(c)
	case c == '}' || c == ']':
		s.close()
	case c == ':' && s.depth == 1:
		s.atKey = false
	case c == ',' && s.depth == 1:
		s.endValue()
		s.atKey = true
	default:
		s.keep(c)
	}
}

// stringByte scans one byte inside a string.
func (s *idScanner) stringByte(c byte) {
	switch {
	case s.esc:
		s.esc = false
	case c == '\\':
		s.esc = true
	case c == '"':
		s.inStr = false
		if s.inKey {
			s.inKey = false
			s.endKey()
			return
		}
	}
	if s.inKey {
		s.keepKey(c)
		return
	}
	s.keep(c)
}

// open scans '{' or '['.
func (s *idScanner) open(c byte) {
	if s.depth == 0 {
		if c != '{' {
			s.broken = true
			s.done = true
			return
		}
		s.depth, s.atKey = 1, true
		return
	}
	if s.depth == 1 && s.field != "" {
		s.valCut = true
	}
	s.depth++
}

// close scans '}' or ']'.
func (s *idScanner) close() {
	if s.depth == 1 {
		s.endValue()
	}
	s.depth--
	if s.depth <= 0 { // the object ended (or never began): nothing after counts
		s.broken = s.broken || s.depth < 0
		s.done = true
	}
}

// keep records c as part of the id's value, if one is being read.
func (s *idScanner) keep(c byte) {
	if s.depth == 0 {
		s.broken, s.done = true, true
		return
	}
	if s.depth != 1 || s.field == "" || s.valCut {
		return
	}
	if len(s.val) == maxScanID {
		s.valCut = true
		return
	}
	s.val = append(s.val, c)
}

// keepKey records c as part of a depth-1 key.
func (s *idScanner) keepKey(c byte) {
	if len(s.key) == maxScanKey {
		s.keyCut = true
		return
	}
	s.key = append(s.key, c)
}

// endKey names the field whose value follows.
func (s *idScanner) endKey() {
	s.field, s.val, s.valCut = "", s.val[:0], false
	if s.keyCut {
		return
	}
	name := string(s.key)
	if strings.ContainsRune(name, '\\') {
		if err := json.Unmarshal([]byte(`"`+name+`"`), &name); err != nil {
			return
		}
	}
	switch {
	case strings.EqualFold(name, "id"):
		s.field = "id"
	case strings.EqualFold(name, "method"):
		s.field = "method"
	}
}

// endValue ends the value of a depth-1 field.
func (s *idScanner) endValue() {
	switch s.field {
	case "id":
		s.found = nil
		if !s.valCut && validID(s.val) {
			s.found = bytes.Clone(s.val)
		}
	case "method":
		s.method, s.name = true, ""
		if !s.valCut && len(s.val) > 0 && s.val[0] == '"' {
			_ = json.Unmarshal(s.val, &s.name) // not a valid string: no name
		}
	}
	s.field = ""
}

// validID reports whether v is a JSON number or string.
func validID(v []byte) bool {
	if len(v) == 0 || !json.Valid(v) {
		return false
	}
	return v[0] == '"' || v[0] == '-' || (v[0] >= '0' && v[0] <= '9')
}
