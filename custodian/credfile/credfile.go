// Package credfile reads the custodian's secrets and credentials (TLS key
// and certificates, tokens, the audit signing key) from files whose owner
// and mode are checked first. A file that anyone but its owner can read or
// write has to be assumed copied or replaced, so it is refused rather than
// used.
package credfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxSize bounds a credential file.
const MaxSize = 1 << 20

// ErrUnsafe is wrapped by every refusal of a credential file.
var ErrUnsafe = errors.New("unsafe credential file")

// UnsafeError names the file and the failed check. It wraps ErrUnsafe.
type UnsafeError struct {
	Path  string
	Check string
}

// Error names the file and the failed check.
func (e *UnsafeError) Error() string { return fmt.Sprintf("credential file %s: %s", e.Path, e.Check) }

// Unwrap makes errors.Is(err, ErrUnsafe) hold.
func (e *UnsafeError) Unwrap() error { return ErrUnsafe }

// Read returns the contents of a secret file after checking, on the opened file
// itself (so a swap between check and read cannot pass): it is a regular
// file reached without following a final symlink, owned by the effective
// user or root, with no permission bits for group or others, and at most
// MaxSize bytes.
func Read(path string) ([]byte, error) {
	return read(path, 0o077, "group or others access (want 0600 or 0400)")
}

// ReadPublic reads a trust anchor that may be world-readable but must not
// be replaceable by anyone else: a public key or an issuer certificate.
// The same checks as Read apply, except that only group and others write
// bits are refused.
func ReadPublic(path string) ([]byte, error) {
	return read(path, 0o022, "group or others write access")
}

func read(path string, forbidden fs.FileMode, what string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, &UnsafeError{Path: path, Check: "is a symlink"}
	}
	if err != nil {
		return nil, fmt.Errorf("credential file %s: %w", path, &fs.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("credential file %s: %w", path, err)
	}
	if err := check(path, fi, forbidden, what); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("credential file %s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, &UnsafeError{Path: path, Check: fmt.Sprintf("larger than %d bytes", MaxSize)}
	}
	return data, nil
}

// check applies the owner, type and mode rules to an opened file.
func check(path string, fi fs.FileInfo, forbidden fs.FileMode, what string) error {
	if !fi.Mode().IsRegular() {
		return &UnsafeError{Path: path, Check: fmt.Sprintf("not a regular file (%s)", fi.Mode().Type())}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return &UnsafeError{Path: path, Check: "no owner information"}
	}
	if euid := os.Geteuid(); int(st.Uid) != euid && st.Uid != 0 {
		return &UnsafeError{Path: path, Check: fmt.Sprintf("owned by uid %d, not %d or root", st.Uid, euid)}
	}
	if perm := fi.Mode().Perm(); perm&forbidden != 0 {
		return &UnsafeError{Path: path, Check: fmt.Sprintf("mode %#o grants %s", perm, what)}
	}
	return nil
}

// CheckPrivateDir refuses a directory that is a symlink, is not a
// directory, is not owned by the effective user, or is writable by group
// or others: anyone who can write there can replace what it holds.
func CheckPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return &UnsafeError{Path: dir, Check: "not a directory (symlinks are refused)"}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return &UnsafeError{Path: dir, Check: "no owner information"}
	}
	if int(st.Uid) != os.Geteuid() {
		return &UnsafeError{Path: dir, Check: fmt.Sprintf("owned by uid %d, not %d", st.Uid, os.Geteuid())}
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return &UnsafeError{Path: dir, Check: fmt.Sprintf("mode %#o is writable by group or others", perm)}
	}
	return nil
}
