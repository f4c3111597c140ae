package longline

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"unicode/utf8"
)

// A read of a long selection does not hold its content in memory either:
// the custodian spools the chunks it reads into a file without a name
// (Spool), checks them there, and the answer is encoded from the file
// (FileContent), a piece at a time.

// Spool makes a file without a name in dir (O_TMPFILE; where the file
// system has none, a temporary file removed at once). The caller closes
// it; its blocks are freed then.
func Spool(dir string) (*os.File, error) { return spool(dir) }

// FileContent is a read's content, valid UTF-8 text, as n bytes at off in
// a spool file. Whoever holds it closes it (Close).
type FileContent struct {
	f      *os.File
	off, n int64
}

// NewFileContent returns the n bytes at off in f as a read's content,
// which the caller checked to be valid UTF-8. Closing f passes to the
// FileContent.
func NewFileContent(f *os.File, off, n int64) *FileContent {
	return &FileContent{f: f, off: off, n: n}
}

// Len is the content's length in bytes.
func (fc *FileContent) Len() int64 { return fc.n }

// Close closes the spool file.
func (fc *FileContent) Close() error { return fc.f.Close() }

// pieceSize is how much of a FileContent is read at once.
const pieceSize = 256 << 10

// pieces calls fn with the content in pieces of at most pieceSize bytes,
// each cut on a character's start (the content is valid UTF-8), through
// one buffer fn must not keep.
func (fc *FileContent) pieces(fn func(p []byte) error) error {
	buf := make([]byte, pieceSize)
	carry := 0 // bytes of a character cut at the end of the last piece, moved to buf's start
	for off := int64(0); off < fc.n; {
		m, err := fc.f.ReadAt(buf[carry:carry+int(min(int64(pieceSize-carry), fc.n-off))], fc.off+off)
		if err != nil && (err != io.EOF || m == 0) {
			return fmt.Errorf("read the spooled content back: %w", err)
		}
		off += int64(m)
		p := buf[:carry+m]
		cut := len(p)
		if off < fc.n {
			cut = runeCut(p)
		}
		if err := fn(p[:cut]); err != nil {
			return err
		}
		carry = copy(buf, p[cut:])
	}
	if carry > 0 {
		return fn(buf[:carry])
	}
	return nil
}

// runeCut returns where p can be cut so that no character is split: the
// start of a last character that p does not hold whole, or len(p).
func runeCut(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if utf8.FullRune(p[i:]) {
				return len(p)
			}
			return i
		}
	}
	return len(p)
}

// writeQuotedFile writes fc as a JSON string, as writeQuoted writes the
// same content held as a string.
func writeQuotedFile(w *bufio.Writer, fc *FileContent) error {
	w.WriteByte('"')
	err := fc.pieces(func(p []byte) error {
		writeQuotedBody(w, p)
		return nil
	})
	if err != nil {
		return err
	}
	return w.WriteByte('"')
}

// QuotedLen returns the length of the content as a JSON string, as
// json.Marshal writes it, without making it.
func (fc *FileContent) QuotedLen() (int64, error) {
	n := int64(2)
	err := fc.pieces(func(p []byte) error {
		n += quotedBodyLen(p)
		return nil
	})
	return n, err
}

// String reads the whole content into a string (for the SDK's own path,
// which answers a read it serves from a string).
func (fc *FileContent) String() (string, error) {
	b := make([]byte, fc.n)
	if _, err := fc.f.ReadAt(b, fc.off); err != nil && !(err == io.EOF && fc.n == 0) {
		return "", fmt.Errorf("read the spooled content back: %w", err)
	}
	return string(b), nil
}
