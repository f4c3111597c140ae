package fsops

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// ReadResult is the selected text of a file and facts about the whole file.
type ReadResult struct {
	Content string // the selected lines
	Size    int64  // size of the whole file
	SHA256  string // lowercase hex SHA-256 of the whole file
}

// Read returns lines [line, line+limit) of the regular file rel (line is
// 1-based, 0 means 1; limit 0 means to the end). The whole file must fit
// in MaxFileBytes, have one hard link and be valid UTF-8; its digest covers
// every byte, so a later Write can use it as ExpectSHA256.
func (r *Root) Read(rel string, line, limit int) (ReadResult, error) {
	if line < 0 || limit < 0 {
		return ReadResult{}, fmt.Errorf("%w: line %d and limit %d must not be negative", ErrInvalid, line, limit)
	}
	f, size, err := r.openRegular(rel)
	if err != nil {
		return ReadResult{}, err
	}
	defer f.Close()
	data, sum, err := r.readAll(f, rel)
	if err != nil {
		return ReadResult{}, err
	}
	if !utf8.Valid(data) {
		return ReadResult{}, fmt.Errorf("read %q: %w", rel, ErrNotText)
	}
	return ReadResult{Content: string(selectLines(data, line, limit)), Size: size, SHA256: sum}, nil
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

// readAll reads f whole, bounded by MaxFileBytes even if it grows.
func (r *Root) readAll(f *os.File, rel string) ([]byte, string, error) {
	h := sha256.New()
	var buf bytes.Buffer
	n, err := io.Copy(io.MultiWriter(&buf, h), io.LimitReader(f, r.limits.MaxFileBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("read %q: %w", rel, err)
	}
	if n > r.limits.MaxFileBytes {
		return nil, "", fmt.Errorf("%q: %w: grew past %d bytes while read", rel, ErrTooLarge, r.limits.MaxFileBytes)
	}
	return buf.Bytes(), hexSum(h), nil
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

// selectLines returns limit lines starting at the 1-based line (0 = 1);
// limit 0 means to the end. Lines keep their terminating newline.
func selectLines(data []byte, line, limit int) []byte {
	start := 0
	for i := 1; i < line; i++ {
		nl := bytes.IndexByte(data[start:], '\n')
		if nl < 0 {
			return nil
		}
		start += nl + 1
	}
	if limit == 0 {
		return data[start:]
	}
	end := start
	for i := 0; i < limit && end < len(data); i++ {
		nl := bytes.IndexByte(data[end:], '\n')
		if nl < 0 {
			return data[start:]
		}
		end += nl + 1
	}
	return data[start:end]
}

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
