package receiver

import (
	"sync"
	"unicode/utf8"
)

// tailBuffer keeps the last limit bytes written to it, cut at a UTF-8
// boundary, as ACP terminal output is truncated from the start.
type tailBuffer struct {
	mu        sync.Mutex
	limit     int
	buf       []byte
	truncated bool
}

func newTailBuffer(limit int) *tailBuffer { return &tailBuffer{limit: limit} }

// Write appends p and drops bytes from the start beyond the limit; it
// never fails, so a chatty child is never blocked by a full buffer.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) >= b.limit {
		b.buf = append(b.buf[:0], p[len(p)-b.limit:]...)
		b.truncated = b.truncated || len(p) > b.limit
	} else {
		b.buf = append(b.buf, p...)
	}
	if over := len(b.buf) - b.limit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
		b.truncated = true
	}
	if b.truncated {
		b.buf = trimToRuneStart(b.buf)
	}
	return len(p), nil
}

// trimToRuneStart drops at most three continuation bytes at the start so
// the kept text begins on a character boundary.
func trimToRuneStart(b []byte) []byte {
	i := 0
	for i < len(b) && i < utf8.UTFMax-1 && !utf8.RuneStart(b[i]) {
		i++
	}
	if i == 0 {
		return b
	}
	return append(b[:0], b[i:]...)
}

// Snapshot returns the kept output and whether anything was dropped. While
// the command runs (final false) a character whose last bytes have not
// arrived yet is held back, so output polled so far always ends on a
// character boundary; the next poll shows it whole. The final snapshot
// returns every byte kept.
func (b *tailBuffer) Snapshot(final bool) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if final {
		return string(b.buf), b.truncated
	}
	return string(b.buf[:completeRunes(b.buf)]), b.truncated
}

// completeRunes returns the length of b without a trailing incomplete
// UTF-8 sequence (at most three bytes that start a character and need
// more). Bytes that can never be UTF-8 are not held back.
func completeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-(utf8.UTFMax-1); i-- {
		if !utf8.RuneStart(b[i]) {
			continue
		}
		if utf8.FullRune(b[i:]) {
			return len(b)
		}
		return i
	}
	return len(b)
}
