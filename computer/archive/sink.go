package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// rootSink writes entries beneath prefix in an os.Root: no name can
// reach outside the root, whatever a check missed. It also refuses to
// write through any parent that is not a directory, symlinks within the
// root included, so an entry lands exactly where its name says. What it
// writes is owned by owner with the entry's permission bits only.
type rootSink struct {
	root   *os.Root
	prefix string // a local path, or "" for the root itself
	owner  Owner
	made   map[string]bool // directories this sink made or checked
}

var _ sink = (*rootSink)(nil)

func newRootSink(root *os.Root, prefix string, owner Owner) *rootSink {
	return &rootSink{root: root, prefix: prefix, owner: owner, made: map[string]bool{}}
}

func (s *rootSink) path(name string) string {
	if s.prefix == "" {
		return name
	}
	return path.Join(s.prefix, name)
}

// Mkdir makes the directory name, or sets the mode of one this sink made
// as a parent before the archive listed it.
func (s *rootSink) Mkdir(name string, mode fs.FileMode) error {
	p := s.path(name)
	if err := s.parents(p); err != nil {
		return err
	}
	if !s.made[p] {
		if err := s.root.Mkdir(p, 0o700); err != nil {
			return fmt.Errorf("make directory %s: %w", p, err)
		}
	}
	return s.ownDir(p, mode)
}

// mkdir makes p (whose parents exist), owned by owner, with mode's
// permission bits.
func (s *rootSink) mkdir(p string, mode fs.FileMode) error {
	if err := s.root.Mkdir(p, 0o700); err != nil {
		return fmt.Errorf("make directory %s: %w", p, err)
	}
	return s.ownDir(p, mode)
}

// ownDir sets the owner and mode of the directory p on the opened
// directory, not by name (os.Root's Chmod and Chown by name may act on
// a symlink swapped in meanwhile).
func (s *rootSink) ownDir(p string, mode fs.FileMode) error {
	f, err := s.root.Open(p)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", p, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.IsDir() {
		return unsafeEntry(p, "is no longer a directory (%v)", err)
	}
	if err := s.own(f, mode); err != nil {
		return fmt.Errorf("directory %s: %w", p, err)
	}
	s.made[p] = true
	return nil
}

// parents makes the missing parents of p (mode 0755, owned by owner) and
// refuses a parent that is there but is no directory.
func (s *rootSink) parents(p string) error {
	dir := path.Dir(p)
	if dir == "." || s.made[dir] {
		return nil
	}
	elems := strings.Split(dir, "/")
	for i := range elems {
		d := strings.Join(elems[:i+1], "/")
		if s.made[d] {
			continue
		}
		fi, err := s.root.Lstat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := s.mkdir(d, 0o755); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("check the parent %s: %w", d, err)
		case !fi.IsDir():
			return unsafeEntry(p, "parent %s is not a directory (%v)", d, fi.Mode().Type())
		default:
			s.made[d] = true
		}
	}
	return nil
}

// WriteFile creates name (never over an existing name: O_EXCL) and
// writes exactly size bytes of r to it.
func (s *rootSink) WriteFile(name string, mode fs.FileMode, r io.Reader, size int64) error {
	p := s.path(name)
	if err := s.parents(p); err != nil {
		return err
	}
	f, err := s.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	_, err = io.CopyN(f, r, size)
	if err == nil {
		err = s.own(f, mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// Symlink makes name a symlink to target. The target is not checked: it
// is data, and no later entry is written through it (parents).
func (s *rootSink) Symlink(target, name string) error {
	p := s.path(name)
	if err := s.parents(p); err != nil {
		return err
	}
	if err := s.root.Symlink(target, p); err != nil {
		return fmt.Errorf("symlink %s: %w", p, err)
	}
	if err := s.root.Lchown(p, s.owner.UID, s.owner.GID); err != nil {
		return fmt.Errorf("symlink %s: %w", p, err)
	}
	return nil
}

// SetTime sets name's access and modification times to mtime, through
// its parent opened in the root and without following name itself when
// it is a symlink.
func (s *rootSink) SetTime(name string, mtime time.Time) error {
	p := s.path(name)
	parent, err := s.root.Open(path.Dir(p))
	if err != nil {
		return err
	}
	defer parent.Close()
	if fi, err := parent.Stat(); err != nil || !fi.IsDir() {
		return unsafeEntry(p, "parent is no longer a directory (%v)", err)
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(int(parent.Fd()), path.Base(p), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// Special refuses every other type of entry.
func (s *rootSink) Special(hdr *tar.Header) error {
	return unsafeEntry(hdr.Name, "type %q is not a regular file, directory or symlink", hdr.Typeflag)
}

// own sets the owner, then the permission bits (chown first: it would
// clear set-id bits, and none is ever set).
func (s *rootSink) own(f *os.File, mode fs.FileMode) error {
	if err := f.Chown(s.owner.UID, s.owner.GID); err != nil {
		return err
	}
	return f.Chmod(mode.Perm())
}

// removeContents removes everything in root, leaving root itself.
func removeContents(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, root.RemoveAll(n))
	}
	return errors.Join(errs...)
}
