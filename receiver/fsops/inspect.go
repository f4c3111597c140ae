package fsops

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Info describes one file system object.
type Info struct {
	Type    string // "file", "dir", "symlink" or "other"
	Size    int64
	Mode    uint32 // permission bits, including setuid, setgid and sticky
	UID     uint32
	GID     uint32
	ModTime time.Time
}

func infoOf(st *unix.Stat_t) Info {
	return Info{
		Type:    typeName(st.Mode),
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		UID:     st.Uid,
		GID:     st.Gid,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
	}
}

// Stat describes rel ("" is the root) without following a final symlink:
// a final symlink is described as itself, wherever it points.
func (r *Root) Stat(rel string) (Info, error) {
	fd, err := r.open(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Info{}, fmt.Errorf("fstat %q: %w", rel, err)
	}
	return infoOf(&st), nil
}

// Entry is one directory entry as List returns it.
type Entry struct {
	Name string
	Type string
	Size int64
}

// List returns the entries of directory rel sorted by name. At most
// MaxListEntries are returned; truncated reports that more exist (the
// returned ones are then the first the directory yields, sorted).
func (r *Root) List(rel string) (entries []Entry, truncated bool, err error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, false, err
	}
	f := fileOf(fd, rel)
	defer f.Close()
	names, truncated, err := readNames(f, r.limits.MaxListEntries)
	if err != nil {
		return nil, false, fmt.Errorf("list %q: %w", rel, err)
	}
	sort.Strings(names)
	entries = make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed while listed
		}
		entries = append(entries, Entry{Name: n, Type: typeName(st.Mode), Size: st.Size})
	}
	return entries, truncated, nil
}

// readNames reads up to max names; truncated reports that more remain.
func readNames(f *os.File, max int) ([]string, bool, error) {
	var names []string
	for len(names) <= max {
		batch, err := f.Readdirnames(max + 1 - len(names))
		names = append(names, batch...)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, false, err
		}
		if len(batch) == 0 {
			break
		}
	}
	if len(names) > max {
		return names[:max], true, nil
	}
	return names, false, nil
}

// Hash returns the lowercase hex SHA-256 of each regular file in rels, ""
// for one that is missing or not a regular file. An escaping path, a
// hard-linked or oversized file fails the whole call: a digest must never
// describe a file outside the root.
func (r *Root) Hash(rels []string) (map[string]string, error) {
	if len(rels) > r.limits.MaxHashPaths {
		return nil, fmt.Errorf("%w: %d paths, limit %d", ErrTooLarge, len(rels), r.limits.MaxHashPaths)
	}
	out := make(map[string]string, len(rels))
	for _, rel := range rels {
		sum, err := r.hashOne(rel)
		if err != nil {
			return nil, err
		}
		out[rel] = sum
	}
	return out, nil
}

func (r *Root) hashOne(rel string) (string, error) {
	f, _, err := r.openRegular(rel)
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotRegular), errors.Is(err, ErrNotDir):
		return "", nil
	case err != nil:
		return "", err
	}
	defer f.Close()
	return r.hashFile(f, rel)
}

// OpenDir resolves directory rel beneath the root and returns an O_PATH
// descriptor a spawning thread can fchdir to, so a child's working
// directory is the directory that was checked, not a path resolved again.
// The caller closes it.
func (r *Root) OpenDir(rel string) (*os.File, error) {
	fd, err := r.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return fileOf(fd, rel), nil
}
