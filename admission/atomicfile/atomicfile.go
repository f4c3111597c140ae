// Package atomicfile replaces a file so that a crash leaves the old bytes
// or the new ones, never a mix or an empty file: a temp file in the same
// directory, written, fsynced, renamed over the target, then the directory
// fsynced. It is the one temp-and-rename writer of tether; a leaf, it
// imports the standard library only.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
	return WriteFrom(path, perm, opts, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFrom is Write for content that is streamed: fill writes it to the
// temp file (unbuffered: fill flushes its own buffers before it returns).
// An error from fill is returned and path is untouched.
func WriteFrom(path string, perm fs.FileMode, opts Options, fill func(io.Writer) error) error {
	dir := filepath.Dir(path)
	ops := Ops{
		Create:  func() (*os.File, error) { return createTemp(dir, filepath.Base(path), perm, opts.Temp) },
		Rename:  func(tmp string) error { return os.Rename(tmp, path) },
		Remove:  func(tmp string) { _ = os.Remove(tmp) },
		SyncDir: func() error { return SyncDir(dir) },
	}
	if err := Replace(ops, perm, opts, fill); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// Ops are the filesystem calls of one replacement. WriteFrom makes them
// from a path; a caller that holds its directory open (admission/
// signedfile, descriptor-relative and symlink-proof) passes its own, so
// the one sequence runs either way.
type Ops struct {
	// Create creates the temp file exclusively; its Name is what Rename
	// and Remove are given.
	Create func() (*os.File, error)
	// Rename renames the temp file over the target.
	Rename func(tmp string) error
	// Remove removes the temp file after a failure before the rename.
	Remove func(tmp string)
	// SyncDir fsyncs the directory (through DirSync, so tests see it).
	SyncDir func() error
}

// Replace runs the sequence: create the temp file, set its mode (and
// owner), fill it, fsync, close, rename it over the target, fsync the
// directory. Before the rename a failure removes the temp file and leaves
// the target untouched; a failed directory fsync leaves the new content
// in place but not durable.
func Replace(ops Ops, perm fs.FileMode, opts Options, fill func(io.Writer) error) error {
	f, err := ops.Create()
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	tmp := f.Name()
	step(StepCreate)
	if err := finish(f, perm, opts, fill); err != nil {
		ops.Remove(tmp)
		return fmt.Errorf("write temp file: %w", err)
	}
	if err := ops.Rename(tmp); err != nil {
		ops.Remove(tmp)
		return fmt.Errorf("rename: %w", err)
	}
	step(StepRename)
	if err := ops.SyncDir(); err != nil {
		return err
	}
	step(StepSyncDir)
	return nil
}

// createTemp opens the temp file in dir, never following a link: O_EXCL
// fails on an existing name, a symlink included.
func createTemp(dir, base string, perm fs.FileMode, temp string) (*os.File, error) {
	if temp == "" {
		temp = "." + base + ".tmp-*"
	}
	if strings.Contains(temp, "*") {
		return os.CreateTemp(dir, temp)
	}
	return os.OpenFile(filepath.Join(dir, temp), os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
}

// finish sets the owner, then the mode (CreateTemp makes 0600; umask
// trims OpenFile's), lets fill write, fsyncs and closes f.
func finish(f *os.File, perm fs.FileMode, opts Options, fill func(io.Writer) error) error {
	var err error
	if opts.Chown { // first: a chown may clear the set-id bits of the mode
		err = f.Chown(opts.UID, opts.GID)
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = fill(f)
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
