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
)

// DirSync fsyncs the open directory d. It is a variable so tests can count
// and break directory syncs, like the packages' fdatasync hooks; nothing
// else assigns it.
var DirSync = func(d *os.File) error { return d.Sync() }

// SyncDir fsyncs dir, making the entries created, renamed or removed in it
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := DirSync(d); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

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
