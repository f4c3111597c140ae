//go:build !linux

package statedir

import (
	"errors"
	"fmt"
	"os"
)

var errUnimplemented = errors.New("the state directory's checks (openat2 without symlinks, owner, mode) are implemented for linux only")

// Open fails closed where the checks are not implemented.
func Open(path string) (*Dir, error) { return nil, fmt.Errorf("%w: %w", ErrUnsafe, errUnimplemented) }

// OpenFile fails closed where the checks are not implemented.
func (d *Dir) OpenFile(string, int) (*os.File, error) { return nil, errUnimplemented }

// ReadFile fails closed where the checks are not implemented.
func (d *Dir) ReadFile(string, int64) ([]byte, error) { return nil, errUnimplemented }

// Lock fails closed where the checks are not implemented.
func (d *Dir) Lock(string) (func(), error) { return nil, errUnimplemented }

// WriteAtomic fails closed where the checks are not implemented.
func (d *Dir) WriteAtomic(string, []byte) error { return errUnimplemented }

// Sync fails closed where the checks are not implemented.
func (d *Dir) Sync() error { return errUnimplemented }

// Flock fails closed where the checks are not implemented.
func Flock(*os.File, bool) error { return errUnimplemented }
