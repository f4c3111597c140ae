// Package archive moves a computer's files in and out with a receipt: it
// exports a computer's root as a tar.zst stream, imports such a stream
// into an empty directory after checking its SHA-256, and copies single
// files and folders in and out as docker cp does. Every call returns a
// Receipt with the SHA-256 of what it moved.
//
// Extraction is the security-relevant half: a stream comes from a user.
// Every entry is checked before anything is written (a local name
// without "..", a regular file, directory or symlink, no setuid or
// setgid bit, within the size and count caps), no entry is written
// through a symlink or a non-directory parent, and every write goes
// through an os.Root, so even a check that missed cannot reach outside
// the destination. Ownership is the caller's Owner, never the archive's.
package archive

import (
	"errors"
	"fmt"
)

// Receipt says what an export, import or copy moved.
type Receipt struct {
	// SHA256 is the lowercase hex SHA-256 of the stream: the tar.zst
	// bytes for Export and Import, the file's content for a copied file,
	// the uncompressed tar stream (as Export's tar, before compression)
	// for a copied folder.
	SHA256 string `json:"sha256"`
	// Bytes is the length of the stream SHA256 covers.
	Bytes int64 `json:"bytes"`
	// Files counts the entries moved: regular files, directories and
	// symlinks (the destination folder of a copy is not counted).
	Files int64 `json:"files"`
	// Skipped counts what an export or copy out left out: sockets,
	// fifos and device nodes, which no archive carries.
	Skipped int64 `json:"skipped,omitempty"`
}

// Limits bound what an import or copy in may write. Zero fields take
// DefaultLimits' values.
type Limits struct {
	// MaxBytes caps the sum of the regular files' sizes.
	MaxBytes int64
	// MaxFiles caps the number of entries.
	MaxFiles int64
	// MaxStreamBytes caps the bytes read of the stream itself.
	MaxStreamBytes int64
}

// DefaultLimits are the caps of a zero Limits.
var DefaultLimits = Limits{MaxBytes: 16 << 30, MaxFiles: 1 << 20, MaxStreamBytes: 16 << 30}

func (l Limits) orDefault() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultLimits.MaxFiles
	}
	if l.MaxStreamBytes <= 0 {
		l.MaxStreamBytes = DefaultLimits.MaxStreamBytes
	}
	return l
}

// Keep, as an Owner's UID or GID, leaves that id as the writing
// process's.
const Keep = -1

// Owner is who owns what an import or copy writes.
type Owner struct {
	UID, GID int
}

// Errors callers branch on; each is wrapped with the entry and the check
// that failed.
var (
	// ErrUnsafeEntry: an entry's name, type, mode or place is refused.
	ErrUnsafeEntry = errors.New("check the archive entry is safe to extract")
	// ErrTooLarge: a size or count cap is exceeded.
	ErrTooLarge = errors.New("check the archive's size caps")
	// ErrDigestMismatch: the stream's SHA-256 is not the expected one.
	ErrDigestMismatch = errors.New("check the stream's SHA-256")
	// ErrNotEmpty: the import directory is not empty, or a copy's
	// destination exists.
	ErrNotEmpty = errors.New("check the destination is new")
)

func unsafeEntry(name, format string, args ...any) error {
	return fmt.Errorf("%w: %q: %s", ErrUnsafeEntry, name, fmt.Sprintf(format, args...))
}
