// Package fsops performs the receiver's file operations beneath a grant
// root. Every path is resolved by the kernel with openat2 and
// RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS relative to a directory descriptor
// of the root, never by string checks: "..", absolute symlinks, symlinks
// out of the root and /proc magic links fail with ErrEscape, also when a
// symlink is swapped in concurrently.
package fsops

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors the receiver maps onto wire codes; every failure wraps exactly one.
var (
	ErrEscape       = errors.New("path resolves outside the grant root")
	ErrNotFound     = errors.New("no such file or directory")
	ErrNotRegular   = errors.New("not a regular file")
	ErrNotDir       = errors.New("not a directory")
	ErrTooLarge     = errors.New("size bound exceeded")
	ErrPrecondition = errors.New("write precondition failed")
	ErrHardLink     = errors.New("file has more than one hard link")
	ErrSymlink      = errors.New("final path component is a symlink")
	ErrInvalid      = errors.New("invalid argument")
	ErrNotText      = errors.New("file is not valid UTF-8 text")
	// ErrBusy: another process holds a lease on the file (fcntl
	// F_SETLEASE), so it cannot be opened until the holder lets go.
	ErrBusy = errors.New("file is leased by another process")
)

// resolveBeneath confines every resolution to the root: no absolute paths
// or symlinks, no ".." above the root, no /proc magic links.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// maxPathLen bounds a relative path (PATH_MAX).
const maxPathLen = 4096

// Owner is the uid and gid every file the receiver writes ends up owned by.
type Owner struct {
	UID, GID uint32
}

// Limits bound one operation. Zero MaxFileBytes refuses every non-empty
// file; the receiver fills these from the grant and its config.
type Limits struct {
	MaxFileBytes   int64 // largest file read, written or hashed
	MaxListEntries int   // directory entries returned before truncation
	MaxHashPaths   int   // paths one Hash call may name
}

// Root is an open grant root. It holds one O_PATH directory descriptor;
// Close releases it. A Root is safe for concurrent use.
type Root struct {
	fd     int
	path   string
	owner  Owner
	limits Limits
}

// OpenRoot opens the absolute, clean directory path as a grant root. The
// root's own path may contain no symlink at all: it comes from a signed
// grant and is resolved strictly. The caller must Close the Root.
func OpenRoot(path string, owner Owner, limits Limits) (*Root, error) {
	if !strings.HasPrefix(path, "/") || strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("%w: grant root %q is not an absolute path", ErrInvalid, path)
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := openat2Retry(unix.AT_FDCWD, path, &how)
	if err != nil {
		return nil, fmt.Errorf("open grant root %q: %w", path, classify(err))
	}
	return &Root{fd: fd, path: path, owner: owner, limits: limits}, nil
}

// Close releases the root's descriptor. It is safe to call twice.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// Path returns the root's absolute path, for messages.
func (r *Root) Path() string { return r.path }

// Limits returns the bounds r enforces.
func (r *Root) Limits() Limits { return r.limits }

// open resolves rel beneath the root with flags (O_CLOEXEC is added).
func (r *Root) open(rel string, flags uint64, mode uint64) (int, error) {
	rel, err := cleanRel(rel)
	if err != nil {
		return -1, err
	}
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: mode, Resolve: resolveBeneath}
	fd, err := openat2Lease(r.fd, rel, &how)
	if err != nil {
		return -1, fmt.Errorf("resolve %q beneath the grant root: %w", rel, classify(err))
	}
	return fd, nil
}

// openat2Lease is openat2Retry that tells a lease from a race. Both give
// EAGAIN: a rename racing the RESOLVE_BENEATH walk, and an O_NONBLOCK open
// of a file another process holds a conflicting lease on. The first does
// not last (openat2Retry retried it); an O_PATH open of the same path,
// which never breaks a lease, then resolves. So an EAGAIN whose path
// still resolves with O_PATH is the lease: ErrBusy.
func openat2Lease(dirfd int, path string, how *unix.OpenHow) (int, error) {
	fd, err := openat2Retry(dirfd, path, how)
	if err != unix.EAGAIN || how.Flags&unix.O_PATH != 0 {
		return fd, err
	}
	probe := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | how.Flags&(unix.O_NOFOLLOW|unix.O_DIRECTORY),
		Resolve: how.Resolve}
	pfd, perr := openat2Retry(dirfd, path, &probe)
	if perr != nil {
		return -1, err
	}
	unix.Close(pfd)
	return -1, fmt.Errorf("%w (EWOULDBLOCK: another process in the computer holds a lease on it; retry once it lets go)", ErrBusy)
}

// cleanRel checks what openat2 cannot: NUL bytes and length. "" means the
// root itself. Everything else, including "..", is left to the kernel.
func cleanRel(rel string) (string, error) {
	switch {
	case strings.ContainsRune(rel, 0):
		return "", fmt.Errorf("%w: path contains NUL", ErrInvalid)
	case len(rel) > maxPathLen:
		return "", fmt.Errorf("%w: path longer than %d bytes", ErrInvalid, maxPathLen)
	case rel == "":
		return ".", nil
	}
	return rel, nil
}

// openat2Retry retries the transient failures openat2 reports when a
// rename races with a RESOLVE_BENEATH walk; persistent EAGAIN is an escape
// attempt as far as the caller is concerned.
func openat2Retry(dirfd int, path string, how *unix.OpenHow) (int, error) {
	var err error
	for range 16 {
		var fd int
		fd, err = unix.Openat2(dirfd, path, how)
		if err == nil {
			return fd, nil
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			return -1, err
		}
	}
	return -1, err
}

// classify maps an errno from resolution onto the package's errors.
func classify(err error) error {
	switch {
	case errors.Is(err, ErrBusy):
		return err
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w (EXDEV: absolute path, \"..\" above the root or a symlink leaving it)", ErrEscape)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w (ELOOP: magic link, symlink loop or symlink where none is allowed)", ErrEscape)
	case errors.Is(err, unix.EAGAIN):
		return fmt.Errorf("%w (EAGAIN: concurrent rename during resolution)", ErrEscape)
	case errors.Is(err, unix.ENOENT):
		return ErrNotFound
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: a path component", ErrNotDir)
	case errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case errors.Is(err, unix.ENXIO), errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%w: %w", ErrNotRegular, err)
	}
	return err
}

// fileOf wraps fd; the caller closes the *os.File.
func fileOf(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }
