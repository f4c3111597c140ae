package longline

import (
	"bytes"
	"encoding/json"
	"strings"

	acp "github.com/coder/acp-go-sdk"
)

// A long write's line is not read by encoding/json whole: the content's
// string is found first (locateContent, a walk that skips strings at the
// speed of bytes.IndexByte), cut out of a copy of the rest of the line,
// and encoding/json decodes and checks that small envelope while the
// content's own syntax is checked by its first unquote pass (newContent).
// A JSON string replaced by another leaves every other token of the line
// as it was, so the envelope is valid exactly when the line is, and
// decodes to the same request but for the content. Whatever the walk
// cannot place for certain (a key written twice, with an escape or a
// byte past ASCII at the two levels it reads, a content that is no
// string) goes to the decode of the whole line, as before.

// locateContent returns the bounds [start, end) of the params' content in
// line, quotes included: the value of the one key of the top-level object
// that folds to "params", an object, and in it the value of the one key
// that folds to "content", a string. ok is false when it cannot place it
// for certain. It checks no syntax but that of the path it walks; the
// caller has encoding/json check the rest. done, if set, is told what of
// line is still to be read as the walk goes through a long string (a
// Content's done).
func locateContent(line []byte, done func(rest []byte)) (start, end int, ok bool) {
	w := walker{b: line, done: done}
	params := false
	found := w.object(func(key []byte) (bool, bool) {
		if !strings.EqualFold(string(key), "params") {
			return false, true
		}
		if params || w.peek() != '{' {
			return false, false // twice, or no object: the whole decode says what it is
		}
		var content [2]int
		ok := w.object(func(key []byte) (bool, bool) {
			if !strings.EqualFold(string(key), "content") {
				return false, true
			}
			if content[1] != 0 || w.peek() != '"' {
				return false, false
			}
			s := w.i
			if !w.str() {
				return false, false
			}
			content = [2]int{s, w.i}
			return true, true
		})
		if !ok || content[1] == 0 {
			return false, false
		}
		params = true
		start, end = content[0], content[1]
		return true, true
	})
	return start, end, found && params
}

// walker walks a JSON text without checking it but where it must.
type walker struct {
	b    []byte
	i    int
	done func(rest []byte) // nil, or told of each window a string's walk has read
}

// strWindow is how much of a string is searched at once before done is
// told.
const strWindow = 1 << 20

// peek returns the next byte after white space, or 0 at the end.
func (w *walker) peek() byte {
	for w.i < len(w.b) {
		switch c := w.b[w.i]; c {
		case ' ', '\t', '\r', '\n':
			w.i++
		default:
			return c
		}
	}
	return 0
}

// object walks an object's members, calling member after each key with
// the walker at its value: member returns whether it walked the value
// itself, and false in ok to stop the walk. A key with an escape or a
// byte past ASCII stops it too.
func (w *walker) object(member func(key []byte) (walked, ok bool)) bool {
	if w.peek() != '{' {
		return false
	}
	w.i++
	if w.peek() == '}' {
		w.i++
		return true
	}
	for {
		if w.peek() != '"' {
			return false
		}
		s := w.i
		if !w.str() {
			return false
		}
		key := w.b[s+1 : w.i-1]
		if !plainKey(key) || w.peek() != ':' {
			return false
		}
		w.i++
		w.peek()
		walked, ok := member(key)
		if !ok || (!walked && !w.value()) {
			return false
		}
		switch w.peek() {
		case ',':
			w.i++
		case '}':
			w.i++
			return true
		default:
			return false
		}
	}
}

// plainKey reports whether key needs no decoding to be compared: no
// escape, nothing past ASCII (which encoding/json folds beyond ASCII's
// cases).
func plainKey(key []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// str walks a string the walker is at: to the first quote after it that
// an even run of backslashes precedes (its end, in a valid string).
func (w *walker) str() bool {
	for j := w.i + 1; ; {
		k := bytes.IndexByte(w.b[j:min(len(w.b), j+strWindow)], '"')
		if k < 0 {
			if j += strWindow; j >= len(w.b) {
				return false
			}
			if w.done != nil {
				w.done(w.b[j:])
			}
			continue
		}
		q := j + k
		n := 0
		for q-n-1 > w.i && w.b[q-n-1] == '\\' {
			n++
		}
		if n%2 == 0 {
			w.i = q + 1
			return true
		}
		j = q + 1
	}
}

// value walks any value: a string, an object or array (strings inside
// walked as strings), or a literal, up to what ends it.
func (w *walker) value() bool {
	switch w.peek() {
	case '"':
		return w.str()
	case '{', '[':
		depth := 0
		for w.i < len(w.b) {
			switch w.b[w.i] {
			case '"':
				if !w.str() {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			w.i++
			if depth == 0 {
				return true
			}
		}
		return false
	case 0:
		return false
	}
	s := w.i
	for w.i < len(w.b) && strings.IndexByte(",}] \t\r\n", w.b[w.i]) < 0 {
		w.i++
	}
	return w.i > s
}

// decodeLocated decodes a long write whose content is at [start, end) in
// line from the envelope: line with that string cut to "". ok is false
// when encoding/json reports anything or the content it fills is not the
// cut one; the caller then decodes the whole line.
func decodeLocated(line []byte, start, end int) (*rawLongRequest, bool) {
	env := make([]byte, 0, len(line)-(end-start)+2)
	env = append(env, line[:start]...)
	env = append(env, `""`...)
	env = append(env, line[end:]...)
	var m rawLongRequest
	if err := json.Unmarshal(env, &m); err != nil || len(m.ID) == 0 || m.Method != acp.ClientMethodFsWriteTextFile {
		return nil, false
	}
	if string(m.Params.Content) != `""` {
		return nil, false
	}
	m.Params.Content = line[start:end]
	return &m, true
}
