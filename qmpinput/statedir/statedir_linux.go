package statedir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// Open opens the state directory at path, creating it with mode 0700 if
// it does not exist. It must be reached without symlinks, be owned by
// the effective uid and have no group or other access.
func Open(path string) (*Dir, error) {
	if path == "" || !filepath.IsAbs(path) {
		abs, err := filepath.Abs(path)
		if err != nil || path == "" {
			return nil, &UnsafeError{Path: path, Reason: "give a directory path"}
		}
		path = abs
	}
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &how)
	if err != nil {
		return nil, &UnsafeError{Path: path, Reason: fmt.Sprintf("open without symlinks: %v", err)}
	}
	d := &Dir{f: os.NewFile(uintptr(fd), path), path: path, uid: uint32(os.Geteuid())}
	if err := d.check(fd, path, unix.S_IFDIR, 0o077); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// check fstats fd: type, owner and no bits of deny in its mode.
func (d *Dir) check(fd int, name string, typ, deny uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != typ:
		return &UnsafeError{Path: name, Reason: "wrong file type"}
	case st.Uid != d.uid:
		return &UnsafeError{Path: name, Reason: fmt.Sprintf("owned by uid %d, want %d", st.Uid, d.uid)}
	case st.Mode&deny != 0:
		return &UnsafeError{Path: name, Reason: fmt.Sprintf("mode %o gives group or others access", st.Mode&0o777)}
	}
	return nil
}

// OpenFile opens name in the directory with flags (O_NOFOLLOW and
// O_CLOEXEC are added; O_CREAT creates with mode 0600) and checks it is a
// regular file of the uid with no group or other access. The caller
// closes the file.
func (d *Dir) OpenFile(name string, flags int) (*os.File, error) {
	if name == "" || filepath.Base(name) != name || name == "." || name == ".." {
		return nil, &UnsafeError{Path: name, Reason: "not a plain file name"}
	}
	fd, err := unix.Openat(int(d.f.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, &UnsafeError{Path: name, Reason: "is a symlink"}
		}
		return nil, &os.PathError{Op: "open", Path: filepath.Join(d.path, name), Err: err}
	}
	if err := d.check(fd, name, unix.S_IFREG, 0o077); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), nil
}

// ReadFile reads name, at most max bytes, through OpenFile. A missing
// file is os.ErrNotExist.
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	f, err := d.OpenFile(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrTooLarge, name, max)
	}
	return b, err
}

// Lock takes an exclusive flock on the lock file name (created if
// missing) and returns the function that releases it.
func (d *Dir) Lock(name string) (func(), error) {
	f, err := d.OpenFile(name, unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return nil, err
	}
	if err := flock(f, unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { flock(f, unix.LOCK_UN); f.Close() }, nil
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// WriteAtomic replaces name with data: admission/atomicfile's sequence
// (a temporary file in the directory, mode 0600, fsync, rename over name,
// fsync of the directory) on calls relative to the open directory. A reader
// sees the old or the new contents, never a mix.
func (d *Dir) WriteAtomic(name string, data []byte) error {
	tmp := "." + name + ".tmp" + strconv.FormatInt(time.Now().UnixNano(), 36)
	dfd := int(d.f.Fd())
	ops := atomicfile.Ops{
		Create: func() (*os.File, error) { return d.OpenFile(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) },
		Rename: func(string) error {
			if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
				return &os.PathError{Op: "rename", Path: filepath.Join(d.path, name), Err: err}
			}
			return nil
		},
		Remove:  func(string) { _ = unix.Unlinkat(dfd, tmp, 0) },
		SyncDir: func() error { return atomicfile.DirSync(d.f) },
	}
	return atomicfile.Replace(ops, 0o600, atomicfile.Options{}, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Sync fsyncs the directory itself (after a file was created in it).
func (d *Dir) Sync() error { return d.f.Sync() }

// Flock takes (how = unix.LOCK_EX) or releases (unix.LOCK_UN) an flock on
// an open file of the directory.
func Flock(f *os.File, exclusive bool) error {
	if exclusive {
		return flock(f, unix.LOCK_EX)
	}
	return flock(f, unix.LOCK_UN)
}
