package longline

import (
	"bufio"
	"encoding/json"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"
)

// A read's answer can hold a whole file (64 MiB by default). The SDK
// would encode it twice (json.Marshal of the result, then again as the
// envelope's json.RawMessage, compacted) and hold both copies; the
// custodian writes it once instead, streaming the content string through
// a bufio.Writer, byte for byte what encoding/json writes (checked by
// FuzzWriteQuoted and FuzzReadAnswer against encoding/json itself).

// hexDigits are the digits of a \u00XX escape, lower case as
// encoding/json writes them.
const hexDigits = "0123456789abcdef"

// htmlSafe[b] reports whether encoding/json (HTML escaping on, its
// default) writes the ASCII byte b as it is inside a string.
var htmlSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

// writeQuoted writes s as a JSON string to w, exactly as json.Marshal
// encodes a Go string: HTML characters and U+2028, U+2029 escaped, each
// byte of invalid UTF-8 as \ufffd. It holds no copy of s: runs of bytes
// written as they are go to w straight from s.
func writeQuoted(w *bufio.Writer, s string) error {
	w.WriteByte('"')
	writeQuotedBody(w, s)
	return w.WriteByte('"') // a bufio.Writer's error sticks: this one is the first, if any
}

// writeQuotedBody writes s as the inside of a JSON string (writeQuoted).
// A piece of a longer content must end on a character's start.
func writeQuotedBody[S ~string | ~[]byte](w *bufio.Writer, s S) {
	start := 0
	for i := 0; i < len(s); {
		if i = htmlSafeRun(s, i); i == len(s) {
			break
		}
		if b := s[i]; b < utf8.RuneSelf {
			writeRun(w, s[start:i])
			switch b {
			case '\\', '"':
				w.WriteByte('\\')
				w.WriteByte(b)
			case '\b':
				w.WriteString(`\b`)
			case '\f':
				w.WriteString(`\f`)
			case '\n':
				w.WriteString(`\n`)
			case '\r':
				w.WriteString(`\r`)
			case '\t':
				w.WriteString(`\t`)
			default:
				w.Write([]byte{'\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF]})
			}
			i++
			start = i
			continue
		}
		c, size := decodeRune(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			writeRun(w, s[start:i])
			w.WriteString(`\ufffd`)
		case c == '\u2028' || c == '\u2029':
			writeRun(w, s[start:i])
			w.Write([]byte{'\\', 'u', '2', '0', '2', hexDigits[c&0xF]})
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	writeRun(w, s[start:])
}

// quotedBodyLen is the length writeQuotedBody writes for s.
func quotedBodyLen[S ~string | ~[]byte](s S) int64 {
	n := int64(0)
	for i := 0; i < len(s); {
		j := htmlSafeRun(s, i)
		if n += int64(j - i); j == len(s) {
			break
		}
		i = j
		if b := s[i]; b < utf8.RuneSelf {
			switch {
			case b == '\\' || b == '"' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
				n += 2
			default:
				n += 6
			}
			i++
			continue
		}
		c, size := decodeRune(s[i:])
		switch {
		case c == utf8.RuneError && size == 1, c == '\u2028' || c == '\u2029':
			n += 6
		default:
			n += int64(size)
		}
		i += size
	}
	return n
}

// decodeRune is utf8.DecodeRune of a string or a byte slice, without
// converting either.
func decodeRune[S ~string | ~[]byte](s S) (rune, int) {
	var b [utf8.UTFMax]byte
	return utf8.DecodeRune(b[:copy(b[:], s)])
}

// writeRun writes s to w through w's own buffer, never growing it.
func writeRun[S ~string | ~[]byte](w *bufio.Writer, s S) {
	for len(s) > 0 {
		if w.Available() == 0 && w.Flush() != nil {
			return // the error sticks in w
		}
		n := min(len(s), w.Available())
		w.Write(append(w.AvailableBuffer(), s[:n]...))
		s = s[n:]
	}
}

// readResultHead is what json.Marshal writes of an
// acp.ReadTextFileResponse before its content string: `{"_meta":...,
// "content":` (_meta left out when empty). The content and the closing
// brace follow (writeReadResult).
func readResultHead(resp *acp.ReadTextFileResponse) ([]byte, error) {
	if len(resp.Meta) == 0 {
		return []byte(`{"content":`), nil
	}
	meta, err := json.Marshal(resp.Meta)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(`{"_meta":`), meta...), `,"content":`...), nil
}

// writeReadResult writes the read's answer as json.Marshal encodes it,
// head (readResultHead) then the content as a JSON string (quoted).
func writeReadResult(w *bufio.Writer, head []byte, quoted func(w *bufio.Writer) error) error {
	w.Write(head)
	if err := quoted(w); err != nil {
		return err
	}
	return w.WriteByte('}')
}

// quotedString writes s as a JSON string (writeReadResult's quoted).
func quotedString(s string) func(w *bufio.Writer) error {
	return func(w *bufio.Writer) error { return writeQuoted(w, s) }
}

// ReadResultLen returns the length of json.Marshal(resp) without making
// it: the size of a read's answer, for a receipt too small to keep it.
// With fc, the content is fc's (resp.Content is empty).
func ReadResultLen(resp *acp.ReadTextFileResponse, fc *FileContent) (int64, error) {
	head, err := readResultHead(resp)
	if err != nil {
		return 0, err
	}
	n := 2 + quotedBodyLen(resp.Content)
	if fc != nil {
		if n, err = fc.QuotedLen(); err != nil {
			return 0, err
		}
	}
	return int64(len(head)) + n + 1, nil
}
