package fsops

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ReadAt returns at most length bytes of the regular file rel from offset
// (fewer at its end) and the file's size. The file passes the checks of
// Read (one link, within MaxFileBytes); it need not be text, since a
// chunk may cut a character: the reader checks the whole.
func (r *Root) ReadAt(rel string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", ErrInvalid, offset, length)
	}
	f, size, err := r.openRegular(rel)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if offset > size {
		return nil, 0, fmt.Errorf("%w: offset %d is past the end of %q (%d bytes)", ErrInvalid, offset, rel, size)
	}
	buf := make([]byte, min(length, size-offset))
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, 0, fmt.Errorf("read %q: %w", rel, err)
	}
	return buf[:n], size, nil
}

// StageRequest opens a staged write: Size bytes whose SHA-256 is SHA256,
// to replace Path with Mode under the preconditions of WriteRequest.
type StageRequest struct {
	Path         string
	Size         int64
	SHA256       string // lowercase hex
	Mode         uint32
	ExpectSHA256 string
	ExpectAbsent bool
}

// Staged is a write being received: content goes, in order, to a file
// that has no name (O_TMPFILE) in the target's directory, so a transfer
// that never commits leaves nothing behind, even when the receiver dies.
// Commit puts it in place; Close drops it. A Staged is not safe for
// concurrent use; its owner serialises Append, Commit and Close.
type Staged struct {
	req      StageRequest
	mode     uint32
	f        *os.File
	h        hash.Hash
	received int64
}

// ErrDigest: a staged write's content does not match the digest or size
// declared when it was opened.
var ErrDigest = errors.New("staged content does not match its declared size and sha256")

// Stage checks req as Write would (bounds, parent directory, final
// component, preconditions), then opens the unnamed staging file. The
// preconditions are checked again at Commit, under the file's lock. The
// caller closes the Staged (after a Commit too).
func (r *Root) Stage(req StageRequest) (*Staged, error) {
	wr := WriteRequest{Path: req.Path, Mode: req.Mode, ExpectSHA256: req.ExpectSHA256, ExpectAbsent: req.ExpectAbsent}
	mode, err := r.checkWrite(&wr)
	if err != nil {
		return nil, err
	}
	if err := r.checkSize(req.Size); err != nil {
		return nil, err
	}
	if !sha256Hex.MatchString(req.SHA256) {
		return nil, fmt.Errorf("%w: sha256 is not a lowercase hex SHA-256", ErrInvalid)
	}
	dfd, name, err := r.openParent(req.Path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	if err := r.checkExisting(dfd, name, &wr); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(dfd, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create unnamed staging file beside %q (O_TMPFILE): %w", req.Path, classify(err))
	}
	return &Staged{req: req, mode: mode, f: fileOf(fd, "staging"), h: sha256.New()}, nil
}

// checkSize refuses a declared size beyond MaxFileBytes.
func (r *Root) checkSize(n int64) error {
	if n < 0 || n > r.limits.MaxFileBytes {
		return fmt.Errorf("%w: content is %d bytes, limit %d", ErrTooLarge, n, r.limits.MaxFileBytes)
	}
	return nil
}

// openParent opens rel's parent directory beneath the root and returns it
// with rel's final component. The caller closes the descriptor.
func (r *Root) openParent(rel string) (int, string, error) {
	dir, name, err := splitParent(rel)
	if err != nil {
		return -1, "", err
	}
	dfd, err := r.open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", fmt.Errorf("parent directory: %w", err)
	}
	return dfd, name, nil
}

// Received returns how many bytes the staged write holds.
func (s *Staged) Received() int64 { return s.received }

// Append writes p at offset, which must be the bytes received so far;
// content past the declared size is ErrTooLarge.
func (s *Staged) Append(offset int64, p []byte) error {
	switch {
	case s.f == nil:
		return fmt.Errorf("%w: the staged write is closed", ErrInvalid)
	case offset != s.received:
		return fmt.Errorf("%w: chunk at offset %d, but %d bytes were received (chunks go in order, once)", ErrInvalid, offset, s.received)
	case int64(len(p)) > s.req.Size-s.received:
		return fmt.Errorf("%w: chunk of %d bytes at %d passes the declared size %d", ErrTooLarge, len(p), offset, s.req.Size)
	}
	if _, err := s.f.Write(p); err != nil {
		return fmt.Errorf("write staging file: %w", err)
	}
	s.h.Write(p)
	s.received += int64(len(p))
	return nil
}

// Close drops the staged content (nothing of it was ever named); after a
// Commit it only releases the descriptor. It is safe to call twice.
func (s *Staged) Close() error {
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// Commit checks that every declared byte arrived with the declared digest,
// sets owner and mode, syncs, then, under the file's lock and after the
// preconditions are checked again, gives the staging file a temporary
// name beside the target and renames it over the target, and syncs the
// directory. The parent is resolved again beneath the root, so a
// directory moved during the transfer cannot carry the file outside it.
func (r *Root) Commit(s *Staged) (WriteResult, error) {
	if s.f == nil {
		return WriteResult{}, fmt.Errorf("%w: the staged write is closed", ErrInvalid)
	}
	if sum := hexSum(s.h); s.received != s.req.Size || sum != s.req.SHA256 {
		return WriteResult{}, fmt.Errorf("%q: %w: received %d bytes with sha256 %s, declared %d bytes with sha256 %s",
			s.req.Path, ErrDigest, s.received, sum, s.req.Size, s.req.SHA256)
	}
	if err := r.seal(s.f, s.mode); err != nil {
		return WriteResult{}, err
	}
	dfd, name, err := r.openParent(s.req.Path)
	if err != nil {
		return WriteResult{}, err
	}
	defer unix.Close(dfd)
	unlock, err := lockEntry(dfd, name)
	if err != nil {
		return WriteResult{}, err
	}
	defer unlock()
	wr := WriteRequest{Path: s.req.Path, ExpectSHA256: s.req.ExpectSHA256, ExpectAbsent: s.req.ExpectAbsent}
	if err := r.checkExisting(dfd, name, &wr); err != nil {
		return WriteResult{}, err
	}
	if err := linkInPlace(dfd, s.f, name, s.req.ExpectAbsent); err != nil {
		return WriteResult{}, fmt.Errorf("write %q: %w", s.req.Path, err)
	}
	return WriteResult{Size: s.received, SHA256: s.req.SHA256}, nil
}

// seal sets owner then mode (chown may clear mode bits) and syncs.
func (r *Root) seal(f *os.File, mode uint32) error {
	fd := int(f.Fd())
	if err := unix.Fchown(fd, int(r.owner.UID), int(r.owner.GID)); err != nil {
		return fmt.Errorf("chown to %d:%d: %w", r.owner.UID, r.owner.GID, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %#o: %w", mode, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync staging file: %w", err)
	}
	return nil
}

// linkInPlace gives the unnamed file f a temporary name in dfd, renames it
// over name (noReplace: only if name is still absent) and syncs the
// directory; the temporary name is removed on failure.
func linkInPlace(dfd int, f *os.File, name string, noReplace bool) error {
	tmp := tempName()
	proc := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if err := unix.Linkat(unix.AT_FDCWD, proc, dfd, tmp, unix.AT_SYMLINK_FOLLOW); err != nil {
		return fmt.Errorf("name the staging file: %w", classify(err))
	}
	return renameInto(dfd, tmp, name, noReplace)
}
