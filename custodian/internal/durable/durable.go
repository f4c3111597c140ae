// Package durable makes the directory entries of the custodian's state
// survive a crash: a file or directory that was created, renamed or
// removed is only durable once the directory holding it is fsynced.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetherdev/tether/admission/atomicfile"
)

// SyncDir fsyncs dir, making the entries created, renamed or removed in it
// durable: admission/atomicfile's SyncDir, so CountSyncs also sees the
// directory syncs of atomicfile.Write.
func SyncDir(dir string) error { return atomicfile.SyncDir(dir) }

// MkdirAll is os.MkdirAll, then an fsync of the parent of every directory
// it created (deepest first), so the new path survives a crash. An
// existing dir costs one Lstat and no fsync.
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		_, err := os.Lstat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("create directory %s: %w", dir, err)
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for _, d := range created {
		if err := SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// CreatedFile reports whether path does not exist yet: call it before
// opening path with O_CREATE, and SyncDir its directory afterwards when
// it returns true.
func CreatedFile(path string) (bool, error) {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, fs.ErrNotExist):
		return true, nil
	}
	return false, fmt.Errorf("stat %s: %w", path, err)
}
