// Package atomicfile replaces a file so that a crash leaves the old bytes
// or the new ones, never a mix or an empty file: a temp file in the same
// directory, written, fsynced, renamed over the target, then the directory
// fsynced. It is the one temp-and-rename writer of tether; a leaf, it
// imports the standard library only.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The steps of Write, in order, as the test hook names them.
const (
	StepCreate  = "create"   // temp file created, nothing written
	StepWrite   = "write"    // data written, not yet fsynced
	StepSync    = "sync"     // temp file fsynced and closed
	StepRename  = "rename"   // renamed over the target
	StepSyncDir = "sync-dir" // directory fsynced: Write is done
)

// Options change how Write creates the temp file.
type Options struct {
	// Temp names the temp file in the target's directory. With a "*" it
	// is a pattern for os.CreateTemp; without one it is the exact name,
	// created with O_EXCL (the caller removes a crash's leftover). Empty
	// means "." + base + ".tmp-*".
	Temp string
	// Chown, when set, gives the temp file to UID:GID before the rename,
	// so the target never appears with the writer's owner.
	Chown    bool
	UID, GID int
}

// FileSync and DirSync fsync the temp file and the directory. They are
// variables so tests can count and break syncs; nothing else assigns them.
var (
	FileSync = func(f *os.File) error { return f.Sync() }
	DirSync  = func(d *os.File) error { return d.Sync() }
)

// stepHook, when set (tests only), is called after each step of Write.
var stepHook func(step string)

func step(name string) {
	if stepHook != nil {
		stepHook(name)
	}
}

// Write replaces path with data (mode perm): temp file, write, fsync,
// chown if asked, rename, fsync of the directory. On an error before the
// rename the temp file is removed and path is untouched; an error from
// the directory fsync leaves the new content in place but not durable.
func Write(path string, data []byte, perm fs.FileMode, opts Options) error {
	dir := filepath.Dir(path)
	f, err := createTemp(dir, filepath.Base(path), perm, opts.Temp)
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	tmp := f.Name()
	step(StepCreate)
	if err := fill(f, data, perm, opts); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	step(StepRename)
	if err := SyncDir(dir); err != nil {
		return err
	}
	step(StepSyncDir)
	return nil
}

// createTemp opens the temp file in dir, never following a link.
func createTemp(dir, base string, perm fs.FileMode, temp string) (*os.File, error) {
	if temp == "" {
		temp = "." + base + ".tmp-*"
	}
	if strings.Contains(temp, "*") {
		return os.CreateTemp(dir, temp)
	}
	return os.OpenFile(filepath.Join(dir, temp), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
}

// fill sets the mode (CreateTemp makes 0600; umask trims OpenFile's),
// writes data, fsyncs and closes f.
func fill(f *os.File, data []byte, perm fs.FileMode, opts Options) error {
	err := f.Chmod(perm)
	if err == nil && opts.Chown {
		err = f.Chown(opts.UID, opts.GID)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		step(StepWrite)
		err = FileSync(f)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	step(StepSync)
	return nil
}

// SyncDir fsyncs dir, making the entries created, renamed or removed in
// it durable.
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
