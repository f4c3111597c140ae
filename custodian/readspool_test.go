package custodian

import (
	"testing"
	"unicode/utf8"
)

// pieces splits data at the cuts given by seed bytes (each one a piece's
// length, 0 meaning 1).
func pieces(data, seed []byte) [][]byte {
	var out [][]byte
	for i := 0; len(data) > 0; i++ {
		n := 1
		if len(seed) > 0 {
			n = max(1, int(seed[i%len(seed)]))
		}
		n = min(n, len(data))
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

// FuzzLineSel: the lines lineSel finds in a text read in pieces are the
// ones selectLines selects from the whole text.
func FuzzLineSel(f *testing.F) {
	f.Add([]byte("a\nb\nc\n"), []byte{1}, 2, 1)
	f.Add([]byte("a\nb\nc"), []byte{2, 1}, 0, 0)
	f.Add([]byte("\n\n\n"), []byte{3}, 4, 1)
	f.Add([]byte("one line"), []byte{5}, 1, 3)
	f.Add([]byte("a\nb\n"), []byte{1}, 3, 0)
	f.Fuzz(func(t *testing.T, data, seed []byte, line, limit int) {
		line, limit = line%64, limit%64
		if line < 0 || limit < 0 {
			return // the receiver's decoder refuses negative line and limit
		}
		s := newLineSel(line, limit)
		for _, p := range pieces(data, seed) {
			s.Write(p)
		}
		start, end := s.Bounds(int64(len(data)))
		if got, want := string(data[start:end]), selectLines(string(data), line, limit); got != want {
			t.Fatalf("line %d limit %d of %q: got %q, want %q", line, limit, data, got, want)
		}
	})
}

// FuzzUTF8Stream: a text checked in pieces is valid exactly when the
// whole is valid UTF-8, whatever the cuts.
func FuzzUTF8Stream(f *testing.F) {
	f.Add([]byte("héllo 日本 \U0001F600"), []byte{1})
	f.Add([]byte("\xe2\x82"), []byte{1})
	f.Add([]byte("\xe2\x82\xac\xff"), []byte{2})
	f.Add([]byte("\xed\xa0\x80"), []byte{1, 2})
	f.Add([]byte("\x80abc"), []byte{3})
	f.Fuzz(func(t *testing.T, data, seed []byte) {
		var u utf8Stream
		for _, p := range pieces(data, seed) {
			u.Write(p)
		}
		if u.Valid() != utf8.Valid(data) {
			t.Fatalf("%q in pieces of %v: Valid %v, utf8.Valid %v", data, seed, u.Valid(), utf8.Valid(data))
		}
	})
}
