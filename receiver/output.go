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

// Snapshot returns the kept output and whether anything was dropped.
func (b *tailBuffer) Snapshot() (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf), b.truncated
}
