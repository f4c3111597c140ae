package routine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
)

// Dir is the routines' directory inside the custodian's state directory,
// beside the op key store (opkeys/) and the audit log (audit/).
const Dir = "routines"

// ext is the file name suffix of a stored template (NAME.json).
const ext = ".json"

// Store keeps templates as files NAME.json in one private directory
// (0700, owned by this user), each written 0600 through a temp file,
// fsync, rename and a directory fsync, so a crash leaves the old
// template or the new one, never a part. It holds no lock and no open
// file; it is safe for concurrent use by one writer (the custodian that
// holds the state directory) and any number of readers.
type Store struct{ dir string }

// OpenStore returns the store of stateDir's routines directory, creating
// it 0700 if needed and refusing one that is not private.
func OpenStore(stateDir string) (*Store, error) {
	dir := filepath.Join(stateDir, Dir)
	if err := durable.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("routine: create %s: %w", Dir, err)
	}
	if err := credfile.CheckPrivateDir(dir); err != nil {
		return nil, fmt.Errorf("routine: %s: %w", Dir, err)
	}
	return &Store{dir: dir}, nil
}

// ReadStore returns the store of stateDir's routines directory for
// reading only: it creates nothing and refuses a directory that is not
// private.
func ReadStore(stateDir string) (*Store, error) {
	dir := filepath.Join(stateDir, Dir)
	if err := credfile.CheckPrivateDir(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return &Store{dir: dir}, nil // no routine saved yet: every Load is ErrNotFound
		}
		return nil, fmt.Errorf("routine: %s: %w", Dir, err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(name string) string { return filepath.Join(s.dir, name+ext) }

// Save writes t under its name. An existing routine of that name is
// refused with ErrExists unless replace is set.
func (s *Store) Save(t *Template, replace bool) error {
	if err := t.Check(); err != nil {
		return err
	}
	data, err := t.Marshal()
	if err != nil {
		return fmt.Errorf("routine: encode %q: %w", t.Name, err)
	}
	if _, err := os.Lstat(s.path(t.Name)); err == nil && !replace {
		return fmt.Errorf("%w: %q (save with replace to overwrite it)", ErrExists, t.Name)
	}
	return s.writeAtomic(t.Name, data)
}

// writeAtomic writes data to name's template file, durably.
func (s *Store) writeAtomic(name string, data []byte) error {
	if err := writeFileAtomic(s.path(name), data); err != nil {
		return fmt.Errorf("routine: write %q: %w", name, err)
	}
	return nil
}

// writeFileAtomic writes data to path with atomicfile.Write through the
// temp file ."+name+".tmp beside it (0600, O_EXCL, a crash's leftover
// removed first), so a reader never sees a part of it and a crash leaves
// the old content or the new one. The one writer of this package.
func writeFileAtomic(path string, data []byte) error {
	tmp := "." + filepath.Base(path) + ".tmp"
	_ = os.Remove(filepath.Join(filepath.Dir(path), tmp)) // a crash's leftover
	return atomicfile.Write(path, data, 0o600, atomicfile.Options{Temp: tmp})
}

// Load reads and checks the template name: ErrBadName, ErrNotFound, or
// ErrCorrupt for a file that is not a regular private file or does not
// decode. The template's name must be the file's.
func (s *Store) Load(name string) (*Template, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.path(name), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrCorrupt, name, err)
	}
	defer f.Close()
	if err := checkFile(f); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrCorrupt, name, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrCorrupt, name, err)
	}
	t, err := Unmarshal(data)
	if err != nil {
		return nil, err
	}
	if t.Name != name {
		return nil, fmt.Errorf("%w: file %q holds routine %q", ErrCorrupt, name, t.Name)
	}
	return t, nil
}

// checkFile refuses a template file that is not a regular file owned by
// this user with mode 0600 or narrower.
func checkFile(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return errors.New("not a regular file")
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("mode %04o is readable or writable by group or others", fi.Mode().Perm())
	case !ok || int(st.Uid) != os.Geteuid():
		return errors.New("not owned by this user")
	}
	return nil
}
