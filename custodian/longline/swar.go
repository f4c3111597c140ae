package longline

// Runs of bytes that a JSON string holds as they are are found eight
// bytes at a time: one word's test says whether any of its bytes needs a
// look of its own (a byte past ASCII, a control character, a quote, a
// backslash and, where HTML is escaped, <, > and &). The tests are exact
// for the word as a whole (they may flag a byte that needs nothing only
// when another in the word does), and a flagged word is left to the
// byte-by-byte path, so what is written is unchanged.

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// hasByte reports whether some byte of x is b.
func hasByte(x uint64, b byte) bool {
	v := x ^ (lo8 * uint64(b))
	return (v-lo8)&^v&hi8 != 0
}

// plainWord reports whether every byte of x is printable ASCII other than
// a quote or a backslash.
func plainWord(x uint64) bool {
	less := (x - lo8*0x20) &^ x & hi8 // some byte < 0x20
	return x&hi8 == 0 && less == 0 && !hasByte(x, '"') && !hasByte(x, '\\')
}

// htmlSafeWord reports whether every byte of x is htmlSafe.
func htmlSafeWord(x uint64) bool {
	return plainWord(x) && !hasByte(x, '<') && !hasByte(x, '>') && !hasByte(x, '&')
}

// load64 is the 8 bytes of s at i, little-endian; i+8 <= len(s).
func load64[S ~string | ~[]byte](s S, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// htmlSafeRun returns the end of the run of htmlSafe bytes of s from i,
// a word at a time, then a byte at a time.
func htmlSafeRun[S ~string | ~[]byte](s S, i int) int {
	for i+8 <= len(s) && htmlSafeWord(load64(s, i)) {
		i += 8
	}
	for i < len(s) && s[i] < 0x80 && htmlSafe[s[i]] {
		i++
	}
	return i
}

// indexStringStop returns the index of the first quote, backslash or
// newline in p, or -1 (bytes.IndexAny(p, "\"\\\n"), a word at a time).
func indexStringStop(p []byte) int {
	i := 0
	for i+8 <= len(p) {
		if x := load64(p, i); hasByte(x, '"') || hasByte(x, '\\') || hasByte(x, '\n') {
			break
		}
		i += 8
	}
	for ; i < len(p); i++ {
		if c := p[i]; c == '"' || c == '\\' || c == '\n' {
			return i
		}
	}
	return -1
}
