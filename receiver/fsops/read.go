package fsops

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math"
	"os"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// ReadResult is the selected text of a file and facts about the whole file.
type ReadResult struct {
	Content string // the selected lines
	Size    int64  // size of the whole file
	SHA256  string // lowercase hex SHA-256 of the whole file
	// Overflow: the selected lines are longer than ReadSelect's bound;
	// Content is empty (Size and SHA256 still describe the whole file).
	Overflow bool
}

// Read returns lines [line, line+limit) of the regular file rel (line is
// 1-based, 0 means 1; limit 0 means to the end). The whole file must fit
// in MaxFileBytes, have one hard link and be valid UTF-8; its digest covers
// every byte, so a later Write can use it as ExpectSHA256.
func (r *Root) Read(rel string, line, limit int) (ReadResult, error) {
	return r.ReadSelect(rel, line, limit, math.MaxInt)
}

// ReadSelect is Read that keeps at most maxContent bytes of selected
// lines: past that it reports Overflow and keeps none. The file is read
// once, in pieces, so memory stays bounded by maxContent whatever its size.
func (r *Root) ReadSelect(rel string, line, limit, maxContent int) (ReadResult, error) {
	if line < 0 || limit < 0 {
		return ReadResult{}, fmt.Errorf("%w: line %d and limit %d must not be negative", ErrInvalid, line, limit)
	}
	f, size, err := r.openRegular(rel)
	if err != nil {
		return ReadResult{}, err
	}
	defer f.Close()
	sel := newLineSelector(line, limit, maxContent)
	sum, err := r.scan(f, rel, sel)
	if err != nil {
		return ReadResult{}, err
	}
	if sel.overflow {
		return ReadResult{Size: size, SHA256: sum, Overflow: true}, nil
	}
	return ReadResult{Content: sel.out.String(), Size: size, SHA256: sum}, nil
}

// readPiece is how much of a file one step of a scan reads.
const readPiece = 64 << 10

// scan reads f whole, bounded by MaxFileBytes even if it grows: it hashes
// every byte, checks the whole is UTF-8 and hands each piece to sel.
func (r *Root) scan(f *os.File, rel string, sel *lineSelector) (string, error) {
	h := sha256.New()
	var text utf8Stream
	buf := make([]byte, readPiece)
	var n int64
	for {
		k, err := f.Read(buf)
		if n += int64(k); n > r.limits.MaxFileBytes {
			return "", fmt.Errorf("%q: %w: grew past %d bytes while read", rel, ErrTooLarge, r.limits.MaxFileBytes)
		}
		h.Write(buf[:k])
		if !text.write(buf[:k]) {
			return "", fmt.Errorf("read %q: %w", rel, ErrNotText)
		}
		sel.write(buf[:k])
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("read %q: %w", rel, err)
		}
	}
	if !text.end() {
		return "", fmt.Errorf("read %q: %w", rel, ErrNotText)
	}
	return hexSum(h), nil
}

// utf8Stream checks that a text given in pieces is valid UTF-8, holding
// back at most three bytes of a character cut between two pieces.
type utf8Stream struct {
	carry [utf8.UTFMax]byte
	n     int
}

// write reports whether p, after what came before, is still valid.
func (u *utf8Stream) write(p []byte) bool {
	for u.n > 0 && len(p) > 0 { // complete the held-back character first
		u.carry[u.n] = p[0]
		u.n++
		p = p[1:]
		if utf8.FullRune(u.carry[:u.n]) {
			valid := utf8.Valid(u.carry[:u.n])
			u.n = 0
			if !valid {
				return false
			}
		}
	}
	if u.n > 0 { // p ended inside the held-back character
		return true
	}
	whole := completePrefix(p)
	if !utf8.Valid(p[:whole]) {
		return false
	}
	u.n = copy(u.carry[:], p[whole:])
	return true
}

// end reports whether no character was left incomplete.
func (u *utf8Stream) end() bool { return u.n == 0 }

// completePrefix returns the length of p without a trailing incomplete
// character (at most three bytes).
func completePrefix(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-(utf8.UTFMax-1); i-- {
		if !utf8.RuneStart(p[i]) {
			continue
		}
		if utf8.FullRune(p[i:]) {
			return len(p)
		}
		return i
	}
	return len(p)
}

// lineSelector keeps lines [first, first+limit) of a text given in pieces
// (limit 0: to the end), at most max bytes of them.
type lineSelector struct {
	first, limit int
	cur          int // 1-based number of the line the next byte belongs to
	max          int
	out          bytes.Buffer
	overflow     bool
}

func newLineSelector(line, limit, max int) *lineSelector {
	if line == 0 {
		line = 1
	}
	return &lineSelector{first: line, limit: limit, cur: 1, max: max}
}

// selected reports whether line n is in the selection.
func (s *lineSelector) selected(n int) bool {
	return n >= s.first && (s.limit == 0 || n-s.first < s.limit)
}

// write adds the selected part of p.
func (s *lineSelector) write(p []byte) {
	for len(p) > 0 && !s.overflow {
		if s.limit != 0 && s.cur-s.first >= s.limit {
			return // past the selection
		}
		seg := p
		if nl := bytes.IndexByte(p, '\n'); nl >= 0 {
			seg = p[:nl+1]
		}
		if s.selected(s.cur) {
			if s.out.Len()+len(seg) > s.max {
				s.overflow = true
				s.out = bytes.Buffer{}
				return
			}
			s.out.Write(seg)
		}
		if seg[len(seg)-1] == '\n' {
			s.cur++
		}
		p = p[len(seg):]
	}
}

// openRegular opens rel for reading and checks it is a regular file with
// one link within MaxFileBytes. O_NONBLOCK keeps a FIFO from blocking the
// open; the type check then refuses it.
func (r *Root) openRegular(rel string) (*os.File, int64, error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, err
	}
	f := fileOf(fd, rel)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("fstat %q: %w", rel, err)
	}
	if err := r.checkRegular(rel, &st); err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size, nil
}

// checkRegular refuses anything but a single-link regular file within the
// size bound. A second hard link could be a link to a file outside the
// root that the grant's uid cannot read or write itself.
func (r *Root) checkRegular(rel string, st *unix.Stat_t) error {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%q: %w (type %s)", rel, ErrNotRegular, typeName(st.Mode))
	case st.Nlink > 1:
		return fmt.Errorf("%q: %w (%d links)", rel, ErrHardLink, st.Nlink)
	case st.Size > r.limits.MaxFileBytes:
		return fmt.Errorf("%q: %w: %d bytes, limit %d", rel, ErrTooLarge, st.Size, r.limits.MaxFileBytes)
	}
	return nil
}

// hashFile streams f into SHA-256, bounded by MaxFileBytes.
func (r *Root) hashFile(f *os.File, rel string) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, r.limits.MaxFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("hash %q: %w", rel, err)
	}
	if n > r.limits.MaxFileBytes {
		return "", fmt.Errorf("%q: %w: grew past %d bytes while hashed", rel, ErrTooLarge, r.limits.MaxFileBytes)
	}
	return hexSum(h), nil
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// typeName names the file type in st_mode as the wire does.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}
