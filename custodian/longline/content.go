package longline

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"
)

// A long fs/write_text_file's content is not decoded into a string: the
// line is decoded by encoding/json as before (so every other field, and
// every check of the JSON's syntax, is exactly the SDK's), but the
// content is kept as its raw JSON string, in the line, and unquoted as it
// is read: once to count and hash it, then once more into the chunks
// sent to the receiver. The custodian never holds the content whole.

// rawString is the raw JSON text of one value, as encoding/json met it
// (a slice of the line, not a copy).
type rawString []byte

// UnmarshalJSON keeps b; it never fails, so encoding/json's own checks
// and type errors are all there is.
func (r *rawString) UnmarshalJSON(b []byte) error { *r = b; return nil }

// writeParams is acp.WriteTextFileRequest with its content left raw: the
// outer Content is the field encoding/json fills for "content" (the
// embedded one is hidden by it), every other field is the SDK type's.
type writeParams struct {
	acp.WriteTextFileRequest
	Content rawString `json:"content"`
}

// rawLongRequest is longRequest with the params of a write left raw.
type rawLongRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params writeParams     `json:"params"`
}

// Content is a long write's content, still in its line: a JSON string
// whose syntax encoding/json checked with the whole line. Len and SHA256
// are of the content decoded, as encoding/json would decode it. The line
// must stay as it is while the Content is used.
type Content struct {
	raw []byte // inside the quotes
	n   int64
	sum string
	// done, if set, is told what of raw is read for good in a pass
	// (rest: what is left of raw), so its pages can leave memory
	// (serveSpooled).
	done func(rest []byte)
}

// errBadString is a JSON string encoding/json would not decode (never
// for one from a line it checked).
var errBadString = errors.New("long line: the content is not a JSON string")

// newContent counts and hashes the content of the raw JSON string raw;
// done, if set, becomes the Content's done.
func newContent(raw []byte, done func(rest []byte)) (*Content, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, errBadString
	}
	c := &Content{raw: raw[1 : len(raw)-1], done: done}
	h := sha256.New()
	err := c.unquote(make([]byte, 0, 256<<10), func(p []byte) error {
		h.Write(p)
		c.n += int64(len(p))
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.sum = hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// Len is the length of the decoded content, in bytes.
func (c *Content) Len() int64 { return c.n }

// SHA256 is the hex SHA-256 of the decoded content.
func (c *Content) SHA256() string { return c.sum }

// Chunks decodes the content again into buf (its capacity, at least 8
// bytes, is the size of a chunk) and calls fn with each chunk in order,
// none longer than that and none empty; fn must not keep p. It stops at
// fn's first error.
func (c *Content) Chunks(buf []byte, fn func(p []byte) error) error {
	if cap(buf) < 4*utf8.UTFMax {
		buf = make([]byte, 0, 4*utf8.UTFMax)
	}
	return c.unquote(buf[:0], fn)
}

// unquote is one pass of unquoteTo over the content, telling c.done
// what it has read each time it emits.
func (c *Content) unquote(buf []byte, fn func(p []byte) error) error {
	return unquoteTo(c.raw, buf, func(p []byte, read int) error {
		if c.done != nil {
			c.done(c.raw[read:])
		}
		return fn(p)
	})
}

// unquoteTo decodes s, the inside of a JSON string, exactly as
// encoding/json's unquoteBytes does (invalid UTF-8 and lone surrogates
// become U+FFFD), into buf, calling emit with buf each time it is nearly
// full (within 2*utf8.UTFMax of its capacity, which must be more than
// that) and at the end with what is left, if anything; read is how much
// of s is decoded into what was emitted so far.
func unquoteTo(s, buf []byte, emit func(p []byte, read int) error) error {
	full := cap(buf) - 2*utf8.UTFMax // room for the longest step
	for r := 0; r < len(s); {
		if len(buf) >= full {
			if err := emit(buf, r); err != nil {
				return err
			}
			buf = buf[:0]
		}
		c := s[r]
		switch {
		case c == '\\':
			n, out, ok := unescape(s[r:], buf)
			if !ok {
				return errBadString
			}
			r += n
			buf = out
		case c == '"' || c < ' ':
			return errBadString
		case c < utf8.RuneSelf:
			// A run of plain ASCII, as far as buf has room.
			end, last := r+1, min(len(s), r+full-len(buf))
			for end < last && plainASCII[s[end]] {
				end++
			}
			buf = append(buf, s[r:end]...)
			r = end
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			buf = utf8.AppendRune(buf, rr)
		}
	}
	if len(buf) > 0 {
		return emit(buf, len(s))
	}
	return nil
}

// unescape decodes the escape at the start of s onto buf and returns how
// many bytes of s it took; ok is false for an escape JSON's syntax has
// not, so that an unquote pass also checks the string's syntax
// (decodeLocated leaves that check to it).
func unescape(s, buf []byte) (int, []byte, bool) {
	if len(s) < 2 {
		return 0, buf, false
	}
	switch s[1] {
	case '"', '\\', '/': // not \' , which encoding/json's unquote takes but its syntax check refuses
		return 2, append(buf, s[1]), true
	case 'b':
		return 2, append(buf, '\b'), true
	case 'f':
		return 2, append(buf, '\f'), true
	case 'n':
		return 2, append(buf, '\n'), true
	case 'r':
		return 2, append(buf, '\r'), true
	case 't':
		return 2, append(buf, '\t'), true
	case 'u':
		rr := getu4(s)
		if rr < 0 {
			return 0, buf, false
		}
		if utf16.IsSurrogate(rr) {
			if dec := utf16.DecodeRune(rr, getu4(s[6:])); dec != unicode.ReplacementChar {
				return 12, utf8.AppendRune(buf, dec), true // a valid pair
			}
			rr = unicode.ReplacementChar
		}
		return 6, utf8.AppendRune(buf, rr), true
	}
	return 0, buf, false
}

// plainASCII[b] reports whether b stands for itself in a JSON string:
// ASCII, no control character, no quote or backslash.
var plainASCII = func() (t [256]bool) {
	for b := ' '; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// getu4 decodes \uXXXX at the start of s, or returns -1 (encoding/json's
// getu4).
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// decodeRawLong decodes a long write with its content left in line:
// ok is false when encoding/json reports anything (a type error, bad
// syntax) or the content is not a JSON string; the caller then decodes
// the line as before, which gives the same request and the same errors.
// done, if set, becomes the Content's done.
//
// The content is found first (locateContent) and only the rest of the
// line is given to encoding/json; a line the walk cannot place is decoded
// whole, the content still left raw.
func decodeRawLong(line []byte, done func(rest []byte)) (*longRequest, bool) {
	m, ok := (*rawLongRequest)(nil), false
	if start, end, found := locateContent(line, done); found {
		m, ok = decodeLocated(line, start, end)
	}
	if !ok {
		m = new(rawLongRequest)
		if err := json.Unmarshal(line, m); err != nil || len(m.ID) == 0 || m.Method != acp.ClientMethodFsWriteTextFile {
			return nil, false
		}
	}
	c, err := newContent(m.Params.Content, done)
	if err != nil {
		return nil, false
	}
	return &longRequest{ID: m.ID, Method: m.Method, Params: m.Params.WriteTextFileRequest, content: c}, true
}
