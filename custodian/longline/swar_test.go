package longline

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzWordTests: a word's tests say what the byte tables say of its
// eight bytes, for any eight bytes, and indexStringStop finds what
// bytes.IndexAny finds.
func FuzzWordTests(f *testing.F) {
	for _, s := range []string{"abcdefgh", "abc\"defg", "\\abcdefg", "abcdefg<", ">&aaaaaa", "0123456789abcdef\\n", "0123456789\"", "0123456789abcdefghij\n", "\x1f\x20\x7f\x80\xffaaa", "é日本aa"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if got, want := indexStringStop(p), bytes.IndexAny(p, "\"\\\n"); got != want {
			t.Fatalf("indexStringStop(%q) = %d, bytes.IndexAny %d", p, got, want)
		}
		if len(p) < 8 {
			return
		}
		x := binary.LittleEndian.Uint64(p)
		if load64(p, 0) != x || load64(string(p), 0) != x {
			t.Fatalf("load64 of %q: %#x, want %#x", p[:8], load64(p, 0), x)
		}
		plain, html := true, true
		for _, b := range p[:8] {
			plain = plain && plainASCII[b]
			html = html && b < 0x80 && htmlSafe[b]
		}
		if plainWord(x) != plain || htmlSafeWord(x) != html {
			t.Fatalf("%q: plainWord %v htmlSafeWord %v, the tables say %v %v", p[:8], plainWord(x), htmlSafeWord(x), plain, html)
		}
	})
}

// TestWordTestsEachByte: every byte value, at every place of a word of
// plain bytes, flags the word exactly when the tables flag the byte.
func TestWordTestsEachByte(t *testing.T) {
	for b := range 256 {
		for k := range 8 {
			p := []byte("aaaaaaaa")
			p[k] = byte(b)
			x := binary.LittleEndian.Uint64(p)
			if plainWord(x) != plainASCII[b] || htmlSafeWord(x) != (b < 0x80 && htmlSafe[b]) {
				t.Fatalf("byte %#x at %d: plainWord %v htmlSafeWord %v", b, k, plainWord(x), htmlSafeWord(x))
			}
			if got := htmlSafeRun(p, 0); (got == 8) != (b < 0x80 && htmlSafe[b]) {
				t.Fatalf("byte %#x at %d: htmlSafeRun %d", b, k, got)
			}
		}
	}
}
