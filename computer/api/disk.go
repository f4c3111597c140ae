package api

import (
	"context"
	"errors"
	"io"
)

// A VM computer's root is in its guest, which the service never
// reaches on the host: its export is its disk instead (a tar.zst stream
// of a manifest and the raw writable disk, computer/archive.ExportDisk),
// and an import of tier vm boots a new computer on such a disk.

// ErrBadDisk wraps every refusal of a disk export an import names: not
// a disk export, another base image, a size over a cap, a disk of
// another digest. The service answers it with bad_request.
var ErrBadDisk = errors.New("check the disk export")

// Transfer is the receipt's part a machine computes: the SHA-256 and
// length of the stream, and the files it holds.
type Transfer struct {
	SHA256 string
	Bytes  int64
	Files  int64
}

// DiskExporter is a Machine whose export is its disk. ExportDisk is
// called on a frozen (suspended) machine only: it writes the disk
// export to w, reading the disk as bytes (never mounting or parsing
// its file system on the host), and returns the stream's Transfer.
type DiskExporter interface {
	ExportDisk(ctx context.Context, w io.Writer) (Transfer, error)
}

// DiskImporter is a Provisioner that makes machines from disk exports.
type DiskImporter interface {
	// CheckDisk reads the disk export r to its end and refuses
	// (ErrBadDisk) one it would not boot; it returns the disk's size.
	// Nothing is made.
	CheckDisk(ctx context.Context, r io.Reader, maxDiskBytes int64) (diskBytes int64, err error)
	// PrepareDisk is Prepare with the machine's writable disk read from
	// the disk export r (checked again as it is read; limits.DiskBytes
	// must be its size).
	PrepareDisk(ctx context.Context, dir string, limits Limits, r io.Reader) (Machine, Transfer, error)
}

// GuestCopier is a Machine whose root is reached through its guest (a
// VM computer): the guest extracts a copy in's tar beneath its root
// and writes a copy out's tar, with the checks of computer/archive's
// ExtractTar and WriteTar. The Transfer's SHA256 and Bytes are of the
// bytes the host sent (CopyIn) or took (CopyOut); Files is the guest's
// claim. A machine that cannot answer (a stopped guest) refuses with a
// conflict *Error.
type GuestCopier interface {
	CopyIn(ctx context.Context, dir string, r io.Reader) (Transfer, error)
	CopyOut(ctx context.Context, path string, w io.Writer) (Transfer, error)
}
