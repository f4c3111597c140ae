package archive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// WriteTar writes src of root to w as an uncompressed tar stream and
// returns its receipt (the SHA-256 and length of the bytes written).
// With src "." the stream holds root's contents with no top entry;
// otherwise its one top entry is src (a regular file, a directory with
// its tree, or a symlink, never followed) renamed to as (src's base
// name when as is empty). Entries are described as Export describes
// them, so the same tree gives the same bytes. The caller keeps root
// and w.
func WriteTar(ctx context.Context, root *os.Root, src, as string, w io.Writer) (Receipt, error) {
	if src != "." {
		var err error
		if src, err = localPath(src); err != nil {
			return Receipt{}, err
		}
		if as == "" {
			as = path.Base(src)
		}
		if as == "." || strings.ContainsAny(as, "/\x00") || as == ".." {
			return Receipt{}, unsafeEntry(as, "not one name")
		}
	}
	hw := newHashWriter(w)
	tw := tar.NewWriter(hw)
	files, skipped, err := writeNamed(ctx, tw, root, src, as)
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("write tar of %s: %w", src, err)
	}
	return Receipt{SHA256: hw.sum(), Bytes: hw.n, Files: files, Skipped: skipped}, nil
}

// writeNamed writes src ("." for the contents of root) and what lies
// beneath it, renaming the src prefix to as.
func writeNamed(ctx context.Context, tw *tar.Writer, root *os.Root, src, as string) (files, skipped int64, err error) {
	if src == "." {
		return writeTree(ctx, tw, root)
	}
	fi, err := root.Lstat(src)
	if err != nil {
		return 0, 0, err
	}
	if !fi.IsDir() {
		wrote, err := writeEntryAs(tw, root, src, as)
		if !wrote && err == nil {
			return 0, 1, nil
		}
		return 1, 0, err
	}
	err = fs.WalkDir(root.FS(), src, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		wrote, err := writeEntryAs(tw, root, name, as+strings.TrimPrefix(name, src))
		if wrote {
			files++
		} else if err == nil {
			skipped++
		}
		return err
	})
	return files, skipped, err
}

// ExtractTar extracts the uncompressed tar stream r beneath the
// directory dir of root ("/" or "" is the root itself), which is made,
// with its missing parents, owned by opts.Owner, when absent. Every top
// name of the stream must be new in dir: nothing that was there is
// replaced or written into. Entries go through the same checks as
// Import; modification times are kept. The stream is read to its end and
// the receipt's SHA256 covers all of it. On failure the new top names
// (and dir, when this call made it) are removed. The caller keeps root.
func ExtractTar(ctx context.Context, r io.Reader, root *os.Root, dir string, opts CopyOptions) (Receipt, error) {
	prefix := ""
	if strings.Trim(dir, "/") != "" {
		var err error
		if prefix, err = localPath(dir); err != nil {
			return Receipt{}, err
		}
	}
	fresh := &freshSink{rootSink: newRootSink(root, prefix, opts.Owner), tops: map[string]bool{}}
	made, err := fresh.makeDir()
	if err != nil {
		return Receipt{}, fmt.Errorf("extract into %s: %w", dir, err)
	}
	x := newExtractor(fresh, opts.Limits)
	hr := &hashReader{r: r, h: sha256.New(), max: x.limits.MaxStreamBytes}
	err = x.run(ctx, tar.NewReader(hr))
	if err == nil {
		_, err = io.Copy(io.Discard, hr)
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("extract into %s: %w", dir, errors.Join(err, fresh.undo(made)))
	}
	return Receipt{SHA256: fmt.Sprintf("%x", hr.h.Sum(nil)), Bytes: hr.n, Files: x.files}, nil
}

// freshSink is a rootSink that refuses a top name that was there before
// the extraction began, and remembers the ones it made.
type freshSink struct {
	*rootSink
	tops map[string]bool
}

// makeDir makes the sink's prefix when it is missing, and reports
// whether it did; an existing prefix must be a directory.
func (s *freshSink) makeDir() (bool, error) {
	if s.prefix == "" {
		return false, nil
	}
	fi, err := s.root.Lstat(s.prefix)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := s.parents(s.prefix); err != nil {
			return false, err
		}
		return true, s.mkdir(s.prefix, 0o755)
	case err != nil:
		return false, err
	case !fi.IsDir():
		return false, unsafeEntry(s.prefix, "is not a directory (%v)", fi.Mode().Type())
	}
	s.made[s.prefix] = true
	return false, nil
}

// claim checks name's top element is new, the first time it is seen.
func (s *freshSink) claim(name string) error {
	top, _, _ := strings.Cut(name, "/")
	if s.tops[top] {
		return nil
	}
	if err := mustBeNew(s.root, s.path(top)); err != nil {
		return err
	}
	s.tops[top] = true
	return nil
}

// undo removes the top names the extraction made, and the prefix when
// made is set.
func (s *freshSink) undo(made bool) error {
	if made {
		return s.root.RemoveAll(s.prefix)
	}
	var errs []error
	for top := range s.tops {
		errs = append(errs, s.root.RemoveAll(s.path(top)))
	}
	return errors.Join(errs...)
}

func (s *freshSink) Mkdir(name string, mode fs.FileMode) error {
	if err := s.claim(name); err != nil {
		return err
	}
	return s.rootSink.Mkdir(name, mode)
}

func (s *freshSink) WriteFile(name string, mode fs.FileMode, r io.Reader, size int64) error {
	if err := s.claim(name); err != nil {
		return err
	}
	return s.rootSink.WriteFile(name, mode, r, size)
}

func (s *freshSink) Symlink(target, name string) error {
	if err := s.claim(name); err != nil {
		return err
	}
	return s.rootSink.Symlink(target, name)
}
