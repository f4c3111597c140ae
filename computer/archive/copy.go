package archive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// CopyOptions say whom a copy's files belong to and what it may write.
type CopyOptions struct {
	// Owner owns everything the copy writes (Keep leaves the copying
	// process's ids).
	Owner Owner
	// Limits cap the copied files; zero fields take defaults.
	Limits Limits
}

// CopyIn copies the host file or folder src into root at dst, a path in
// the root ("/work/x" and "work/x" are the same; no ".." element). dst
// must not exist; its missing parents are made. A folder is copied as
// docker cp does, symlinks as symlinks (never followed, on either side),
// through the same checks as Import. The receipt's SHA256 is the file's
// content, or for a folder the tar stream it was copied as. On failure
// dst is removed. The caller keeps root.
func CopyIn(ctx context.Context, src string, root *os.Root, dst string, opts CopyOptions) (Receipt, error) {
	dst, err := localPath(dst)
	if err != nil {
		return Receipt{}, err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return Receipt{}, fmt.Errorf("copy in: %w", err)
	}
	switch {
	case fi.Mode().IsRegular():
		f, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return Receipt{}, fmt.Errorf("copy in: %w", err)
		}
		defer f.Close()
		return copyFile(f, root, dst, opts)
	case fi.IsDir():
		from, err := os.OpenRoot(src)
		if err != nil {
			return Receipt{}, fmt.Errorf("copy in: %w", err)
		}
		defer from.Close()
		return copyDir(ctx, from, root, dst, opts)
	}
	return Receipt{}, unsafeEntry(src, "copy in: %v is not a regular file or directory", fi.Mode().Type())
}

// CopyOut copies the file or folder src of root (a path in the root, as
// for CopyIn) to the host path dst, which must not exist and whose
// parent must. Symlinks are copied as symlinks, never followed; sockets,
// fifos and devices are left out (Receipt.Skipped); no set-id bit is
// copied. The caller keeps root.
func CopyOut(ctx context.Context, root *os.Root, src, dst string, opts CopyOptions) (Receipt, error) {
	src, err := localPath(src)
	if err != nil {
		return Receipt{}, err
	}
	to, err := os.OpenRoot(filepath.Dir(dst))
	if err != nil {
		return Receipt{}, fmt.Errorf("copy out: %w", err)
	}
	defer to.Close()
	fi, err := root.Lstat(src)
	if err != nil {
		return Receipt{}, fmt.Errorf("copy out: %w", err)
	}
	switch {
	case fi.Mode().IsRegular():
		f, err := root.Open(src)
		if err != nil {
			return Receipt{}, fmt.Errorf("copy out: %w", err)
		}
		defer f.Close()
		return copyFile(f, to, filepath.Base(dst), opts)
	case fi.IsDir():
		from, err := root.OpenRoot(src)
		if err != nil {
			return Receipt{}, fmt.Errorf("copy out: %w", err)
		}
		defer from.Close()
		return copyDir(ctx, from, to, filepath.Base(dst), opts)
	}
	return Receipt{}, unsafeEntry(src, "copy out: %v is not a regular file or directory", fi.Mode().Type())
}

// localPath turns a path in a computer into a root-relative one,
// refusing "..", "." and empty elements and the root itself.
func localPath(p string) (string, error) {
	rel := strings.TrimPrefix(p, "/")
	if !fs.ValidPath(rel) || rel == "." || strings.ContainsRune(rel, 0) || strings.Count(rel, "/") >= maxDepth {
		return "", unsafeEntry(p, "not a path beneath the root")
	}
	return rel, nil
}

// mustBeNew fails with ErrNotEmpty when name exists in root.
func mustBeNew(root *os.Root, name string) error {
	_, err := root.Lstat(name)
	switch {
	case err == nil:
		return fmt.Errorf("%w: %s exists", ErrNotEmpty, name)
	case errors.Is(err, fs.ErrNotExist):
		return nil
	}
	return err
}

// copyFile copies the open regular file f to dst in root, hashing it.
func copyFile(f *os.File, root *os.Root, dst string, opts CopyOptions) (Receipt, error) {
	fi, err := f.Stat()
	if err != nil {
		return Receipt{}, err
	}
	limits := opts.Limits.orDefault()
	if !fi.Mode().IsRegular() {
		return Receipt{}, unsafeEntry(dst, "source is no longer a regular file")
	}
	if fi.Size() > limits.MaxBytes {
		return Receipt{}, fmt.Errorf("%w: %d bytes, over %d", ErrTooLarge, fi.Size(), limits.MaxBytes)
	}
	s := newRootSink(root, "", opts.Owner)
	if err := s.parents(dst); err != nil {
		return Receipt{}, fmt.Errorf("copy %s: %w", dst, err)
	}
	if err := mustBeNew(root, dst); err != nil {
		return Receipt{}, err
	}
	hr := &hashReader{r: f, h: sha256.New(), max: fi.Size()}
	if err := s.WriteFile(dst, fi.Mode(), hr, fi.Size()); err != nil {
		_ = root.Remove(dst)
		return Receipt{}, fmt.Errorf("copy %s: %w", dst, err)
	}
	return Receipt{SHA256: hex.EncodeToString(hr.h.Sum(nil)), Bytes: hr.n, Files: 1}, nil
}

// copyDir copies the tree of from to the new directory dst in root as a
// tar stream through an extractor, and hashes the stream. The writing
// goroutine is joined before copyDir returns.
func copyDir(ctx context.Context, from, root *os.Root, dst string, opts CopyOptions) (Receipt, error) {
	s := newRootSink(root, dst, opts.Owner)
	if err := s.parents(dst); err != nil {
		return Receipt{}, fmt.Errorf("copy %s: %w", dst, err)
	}
	if err := mustBeNew(root, dst); err != nil {
		return Receipt{}, err
	}
	top, err := from.Stat(".")
	if err == nil {
		err = s.mkdir(dst, top.Mode())
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("copy %s: %w", dst, err)
	}
	x := newExtractor(s, opts.Limits)
	rc, err := pipeTree(ctx, from, func(r io.Reader) error { return x.run(ctx, tar.NewReader(r)) })
	if err != nil {
		if rerr := root.RemoveAll(dst); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return Receipt{}, fmt.Errorf("copy %s: %w", dst, err)
	}
	rc.Files = x.files
	return rc, nil
}

// pipeTree writes the tree of from as a tar stream into consume, and
// returns the stream's digest, length and skipped entries once both
// sides are done.
func pipeTree(ctx context.Context, from *os.Root, consume func(io.Reader) error) (Receipt, error) {
	pr, pw := io.Pipe()
	done := make(chan Receipt, 1)
	go func() {
		hw := newHashWriter(pw)
		tw := tar.NewWriter(hw)
		_, skipped, err := writeTree(ctx, tw, from)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
		done <- Receipt{SHA256: hw.sum(), Bytes: hw.n, Skipped: skipped}
	}()
	err := consume(pr)
	if err == nil {
		_, err = io.Copy(io.Discard, pr) // the writer's error, if any, comes here
	}
	pr.CloseWithError(errors.Join(err, io.ErrClosedPipe))
	rc := <-done
	return rc, err
}
