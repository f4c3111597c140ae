// Package statedir is the live view's state directory: the token store
// and the audit log live in one directory owned by the server's uid and
// closed to everyone else. Every file in it is reached through the
// directory's descriptor without following symlinks, must be a regular
// file of that uid with no group or other access, and is written
// atomically (temporary file, fsync, rename, fsync of the directory) or
// appended under an exclusive lock.
package statedir

import (
	"errors"
	"fmt"
	"os"
)

// Errors callers branch on.
var (
	// ErrUnsafe: the directory or a file in it is a symlink, not the
	// expected type, owned by another uid, or open to group or others.
	ErrUnsafe = errors.New("state directory unsafe")
	// ErrTooLarge: a file is larger than the caller's bound.
	ErrTooLarge = errors.New("state file too large")
)

// UnsafeError names the path and the check it failed.
type UnsafeError struct {
	Path   string
	Reason string
}

func (e *UnsafeError) Error() string { return fmt.Sprintf("%v: %s: %s", ErrUnsafe, e.Path, e.Reason) }

func (e *UnsafeError) Unwrap() error { return ErrUnsafe }

// Dir is an open state directory. Close releases its descriptor.
type Dir struct {
	f    *os.File
	path string
	uid  uint32
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// Close closes the directory's descriptor. Safe twice.
func (d *Dir) Close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}
