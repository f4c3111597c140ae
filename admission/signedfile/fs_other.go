//go:build !linux

package signedfile

import (
	"errors"
	"os"
)

// errUnimplemented: the admission file's trust checks rely on Linux
// (openat2 RESOLVE_NO_SYMLINKS, O_NOFOLLOW, flock); elsewhere the file is
// refused rather than checked weakly.
var errUnimplemented = errors.New("admission file: only supported on Linux")

type stamp struct{}

type fileInfo struct {
	stamp   stamp
	regular bool
	dir     bool
	perm    uint32
	uid     uint32
	size    int64
}

func openDir(string) (*os.File, error)                          { return nil, errUnimplemented }
func openFileAt(*os.File, string) (*os.File, error)             { return nil, errUnimplemented }
func createAt(*os.File, string, uint32, bool) (*os.File, error) { return nil, errUnimplemented }
func renameAt(*os.File, string, string) error                   { return errUnimplemented }
func unlinkAt(*os.File, string) error                           { return errUnimplemented }
func flock(*os.File, bool) error                                { return errUnimplemented }
func statFile(*os.File) (fileInfo, error)                       { return fileInfo{}, errUnimplemented }
func statPath(string) (fileInfo, error)                         { return fileInfo{}, errUnimplemented }
func isWouldBlock(error) bool                                   { return false }
