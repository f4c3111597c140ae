package fsops

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// WriteRequest creates or replaces one file beneath the root.
type WriteRequest struct {
	Path    string
	Content []byte
	// Mode is the file's permission bits, 0 meaning 0644. Only 0777 bits
	// are allowed; the result never depends on the receiver's umask.
	Mode uint32
	// ExpectSHA256, when set, requires the current file to exist with this
	// lowercase hex digest.
	ExpectSHA256 string
	// ExpectAbsent requires that no file exists at Path.
	ExpectAbsent bool
}

// WriteResult describes the file as written.
type WriteResult struct {
	Size   int64
	SHA256 string
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Write replaces the file atomically: the content goes to a temporary file
// in the same directory that is owned by the root's Owner with exactly
// Mode, synced, then renamed over Path and the directory synced. Readers
// see the old or the new file, never a mix; a crash leaves the old one.
// The final component must not be a symlink or a hard-linked file, the
// parent directory must exist, and preconditions are checked while
// holding a per-file lock, so two receiver writes with the same
// ExpectSHA256 cannot both succeed.
func (r *Root) Write(req WriteRequest) (WriteResult, error) {
	mode, err := r.checkWrite(&req)
	if err != nil {
		return WriteResult{}, err
	}
	dfd, name, err := r.openParent(req.Path)
	if err != nil {
		return WriteResult{}, err
	}
	defer unix.Close(dfd)
	unlock, err := lockEntry(dfd, name)
	if err != nil {
		return WriteResult{}, err
	}
	defer unlock()
	if err := r.checkExisting(dfd, name, &req); err != nil {
		return WriteResult{}, err
	}
	if err := r.replace(dfd, name, req.Content, mode, req.ExpectAbsent); err != nil {
		return WriteResult{}, fmt.Errorf("write %q: %w", req.Path, err)
	}
	sum := sha256.Sum256(req.Content)
	return WriteResult{Size: int64(len(req.Content)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// checkWrite validates the request and returns the mode to set.
func (r *Root) checkWrite(req *WriteRequest) (uint32, error) {
	switch {
	case req.Mode&^0o777 != 0:
		return 0, fmt.Errorf("%w: mode %#o has bits outside 0777", ErrInvalid, req.Mode)
	case req.ExpectSHA256 != "" && !sha256Hex.MatchString(req.ExpectSHA256):
		return 0, fmt.Errorf("%w: expect_sha256 is not a lowercase hex SHA-256", ErrInvalid)
	case req.ExpectSHA256 != "" && req.ExpectAbsent:
		return 0, fmt.Errorf("%w: expect_sha256 and expect_absent exclude each other", ErrInvalid)
	case int64(len(req.Content)) > r.limits.MaxFileBytes:
		return 0, fmt.Errorf("%w: content is %d bytes, limit %d", ErrTooLarge, len(req.Content), r.limits.MaxFileBytes)
	}
	if req.Mode == 0 {
		return 0o644, nil
	}
	return req.Mode, nil
}

// splitParent splits rel into its parent ("" for the root) and a final
// component that names an entry, never "", "." or "..".
func splitParent(rel string) (dir, name string, err error) {
	if _, err := cleanRel(rel); err != nil {
		return "", "", err
	}
	dir, name = path.Split(rel)
	if name == "" || name == "." || name == ".." {
		return "", "", fmt.Errorf("%w: %q does not end in a file name", ErrInvalid, rel)
	}
	return strings.TrimSuffix(dir, "/"), name, nil
}

// checkExisting inspects the current entry without following a symlink
// and applies the preconditions.
func (r *Root) checkExisting(dfd int, name string, req *WriteRequest) error {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
		if req.ExpectSHA256 != "" {
			return fmt.Errorf("%q: %w: file is absent, expected sha256 %s", req.Path, ErrPrecondition, req.ExpectSHA256)
		}
		return nil
	case err != nil:
		return fmt.Errorf("stat %q: %w", req.Path, classify(err))
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("%q: %w; write its target instead", req.Path, ErrSymlink)
	case req.ExpectAbsent:
		return fmt.Errorf("%q: %w: file exists, expected absent", req.Path, ErrPrecondition)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%q: %w (type %s)", req.Path, ErrNotRegular, typeName(st.Mode))
	}
	if st.Nlink > 1 {
		return fmt.Errorf("%q: %w (%d links)", req.Path, ErrHardLink, st.Nlink)
	}
	if req.ExpectSHA256 == "" {
		return nil
	}
	return r.checkDigest(dfd, name, req)
}

// checkDigest compares the current content's digest with ExpectSHA256.
func (r *Root) checkDigest(dfd int, name string, req *WriteRequest) error {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: resolveBeneath | unix.RESOLVE_NO_SYMLINKS}
	fd, err := openat2Lease(dfd, name, &how)
	if err != nil {
		return fmt.Errorf("open %q: %w", req.Path, classify(err))
	}
	f := fileOf(fd, name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat %q: %w", req.Path, err)
	}
	if err := r.checkRegular(req.Path, &st); err != nil {
		return err
	}
	sum, err := r.hashFile(f, req.Path)
	if err != nil {
		return err
	}
	if sum != req.ExpectSHA256 {
		return fmt.Errorf("%q: %w: current sha256 %s, expected %s", req.Path, ErrPrecondition, sum, req.ExpectSHA256)
	}
	return nil
}

// replace writes content to a fresh temporary entry and renames it over
// name; noReplace makes the rename fail if name appeared meanwhile. It is
// the one atomic write (admission/atomicfile) on the parent's descriptor:
// owner, then mode, then content, fsync, rename, fsync of the directory.
func (r *Root) replace(dfd int, name string, content []byte, mode uint32, noReplace bool) error {
	tmp := tempName()
	ops := atomicfile.Ops{
		Create: func() (*os.File, error) {
			fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return nil, classify(err)
			}
			return fileOf(fd, tmp), nil
		},
		Rename:  func(string) error { return renameAt(dfd, tmp, name, noReplace) },
		Remove:  func(string) { _ = unix.Unlinkat(dfd, tmp, 0) },
		SyncDir: func() error { return syncDirFD(dfd) },
	}
	opts := atomicfile.Options{Chown: true, UID: int(r.owner.UID), GID: int(r.owner.GID)}
	return atomicfile.Replace(ops, fs.FileMode(mode), opts, func(w io.Writer) error {
		_, err := w.Write(content)
		return err
	})
}

// renameInto renames the temporary entry tmp over name (noReplace: only
// if name is absent) and syncs the directory; tmp is removed on failure.
func renameInto(dfd int, tmp, name string, noReplace bool) error {
	if err := renameAt(dfd, tmp, name, noReplace); err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return syncDirFD(dfd)
}

// renameAt renames tmp over name in dfd (noReplace: only if name is
// absent); a name that appeared meanwhile is a failed precondition.
func renameAt(dfd int, tmp, name string, noReplace bool) error {
	var flags uint
	if noReplace {
		flags = unix.RENAME_NOREPLACE
	}
	if err := unix.Renameat2(dfd, tmp, dfd, name, flags); err != nil {
		if err == unix.EEXIST {
			return fmt.Errorf("%w: file appeared, expected absent", ErrPrecondition)
		}
		return fmt.Errorf("rename into place: %w", classify(err))
	}
	return nil
}

// syncDirFD makes the entries renamed in dfd durable.
func syncDirFD(dfd int) error {
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	return nil
}

func tempName() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return ".tether-" + hex.EncodeToString(b[:]) + ".tmp"
}

// entryLocks serialises receiver writes to one directory entry.
var entryLocks = struct {
	sync.Mutex
	m map[entryKey]*entryLock
}{m: map[entryKey]*entryLock{}}

type entryKey struct {
	dev, ino uint64
	name     string
}

type entryLock struct {
	mu   sync.Mutex
	refs int
}

// lockEntry locks (directory identity, name) and returns the unlock.
func lockEntry(dfd int, name string) (func(), error) {
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return nil, fmt.Errorf("fstat parent directory: %w", err)
	}
	k := entryKey{dev: st.Dev, ino: st.Ino, name: name}
	entryLocks.Lock()
	l := entryLocks.m[k]
	if l == nil {
		l = &entryLock{}
		entryLocks.m[k] = l
	}
	l.refs++
	entryLocks.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		entryLocks.Lock()
		if l.refs--; l.refs == 0 {
			delete(entryLocks.m, k)
		}
		entryLocks.Unlock()
	}, nil
}
