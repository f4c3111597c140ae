package signedfile

import (
	"os"

	"golang.org/x/sys/unix"
)

// openDir opens the directory at path without following a symlink in any
// component (openat2 RESOLVE_NO_SYMLINKS, Linux 5.6 or later). The caller
// closes the returned file.
func openDir(path string) (*os.File, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS,
	}
	fd, err := retry(func() (int, error) { return unix.Openat2(unix.AT_FDCWD, path, &how) })
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openFileAt opens name in dir read-only, refusing a final symlink
// (O_NOFOLLOW) and never blocking on a FIFO (O_NONBLOCK). The caller closes
// the returned file.
func openFileAt(dir *os.File, name string) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := retry(func() (int, error) { return unix.Openat(int(dir.Fd()), name, flags, 0) })
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// createAt creates name in dir, failing if it exists or is a symlink, and
// sets perm exactly (whatever the umask). The caller closes the file.
func createAt(dir *os.File, name string, perm uint32, excl bool) (*os.File, error) {
	flags := unix.O_RDWR | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if excl {
		flags |= unix.O_EXCL
	}
	fd, err := retry(func() (int, error) { return unix.Openat(int(dir.Fd()), name, flags, perm) })
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	if err := unix.Fchmod(fd, perm); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "fchmod", Path: name, Err: err}
	}
	return f, nil
}

// renameAt atomically replaces newName with oldName inside dir.
func renameAt(dir *os.File, oldName, newName string) error {
	_, err := retry(func() (int, error) {
		return 0, unix.Renameat(int(dir.Fd()), oldName, int(dir.Fd()), newName)
	})
	if err != nil {
		return &os.LinkError{Op: "renameat", Old: oldName, New: newName, Err: err}
	}
	return nil
}

// unlinkAt removes the file name from dir.
func unlinkAt(dir *os.File, name string) error {
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil {
		return &os.PathError{Op: "unlinkat", Path: name, Err: err}
	}
	return nil
}

// flock takes an exclusive lock on f; with nonblock it fails with
// unix.EWOULDBLOCK instead of waiting.
func flock(f *os.File, nonblock bool) error {
	how := unix.LOCK_EX
	if nonblock {
		how |= unix.LOCK_NB
	}
	_, err := retry(func() (int, error) { return 0, unix.Flock(int(f.Fd()), how) })
	return err
}

// isWouldBlock reports whether a non-blocking flock found the lock held.
func isWouldBlock(err error) bool { return err == unix.EWOULDBLOCK }

// stamp identifies one version of a file cheaply: a rename, an in-place
// write, a chmod or a chown each change it.
type stamp struct {
	dev, ino   uint64
	size       int64
	mode, uid  uint32
	mtim, ctim unix.Timespec
}

// fileInfo is what the trust checks need from a stat.
type fileInfo struct {
	stamp   stamp
	regular bool
	dir     bool
	perm    uint32 // permission bits, including setuid, setgid, sticky
	uid     uint32
	size    int64
}

func infoOf(st *unix.Stat_t) fileInfo {
	return fileInfo{
		stamp:   stamp{dev: st.Dev, ino: st.Ino, size: st.Size, mode: st.Mode, uid: st.Uid, mtim: st.Mtim, ctim: st.Ctim},
		regular: st.Mode&unix.S_IFMT == unix.S_IFREG,
		dir:     st.Mode&unix.S_IFMT == unix.S_IFDIR,
		perm:    st.Mode & 0o7777,
		uid:     st.Uid,
		size:    st.Size,
	}
}

// statFile returns the stat of an open file.
func statFile(f *os.File) (fileInfo, error) {
	var st unix.Stat_t
	if _, err := retry(func() (int, error) { return 0, unix.Fstat(int(f.Fd()), &st) }); err != nil {
		return fileInfo{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return infoOf(&st), nil
}

// statPath returns the stat of path without following a final symlink.
func statPath(path string) (fileInfo, error) {
	var st unix.Stat_t
	if _, err := retry(func() (int, error) { return 0, unix.Lstat(path, &st) }); err != nil {
		return fileInfo{}, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return infoOf(&st), nil
}

// retry repeats a system call interrupted by a signal.
func retry(call func() (int, error)) (int, error) {
	for {
		n, err := call()
		if err != unix.EINTR {
			return n, err
		}
	}
}
