package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"
)

// maxName bounds an entry's name and a symlink's target.
const maxName = 4096

// maxDepth bounds the elements of an entry's name: every write through
// an os.Root walks the name one element at a time, so a name thousands
// of elements deep costs seconds (measured: 14 s for one entry 2,000
// deep), which a stream could repeat for each entry.
const maxDepth = 128

// sink is where an extractor writes. rootSink is the only one outside
// tests; the tests' naive sink shows what an unchecked archive does.
type sink interface {
	Mkdir(name string, mode fs.FileMode) error
	// WriteFile writes exactly size bytes of r to a new file.
	WriteFile(name string, mode fs.FileMode, r io.Reader, size int64) error
	Symlink(target, name string) error
	// Special makes any other type; rootSink refuses it.
	Special(hdr *tar.Header) error
}

// extractor checks each entry of a tar stream and writes it to a sink.
type extractor struct {
	sink   sink
	limits Limits
	// unchecked skips the entry checks; only tests set it, to show that
	// an attack archive does harm with them off (positive controls).
	unchecked bool

	files, bytes int64
	seen         map[string]bool
	// times are the modification times of the entries written, in
	// order; they are set once every entry is written (a directory's
	// would change with each entry written into it).
	times []entryTime
}

// entryTime is one entry's modification time, to be set.
type entryTime struct {
	name  string
	mtime time.Time
}

// timeSetter is a sink that can set an entry's modification time
// without following a symlink.
type timeSetter interface {
	SetTime(name string, mtime time.Time) error
}

func newExtractor(s sink, l Limits) *extractor {
	return &extractor{sink: s, limits: l.orDefault(), seen: map[string]bool{}}
}

// run extracts every entry of tr until its end, the first refusal, or
// ctx's end.
func (x *extractor) run(ctx context.Context, tr *tar.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return x.setTimes()
		}
		if err != nil {
			return fmt.Errorf("read the tar stream: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// entry checks one entry and writes it.
func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	name, skip, err := x.check(hdr)
	if err != nil || skip {
		return err
	}
	mode := hdr.FileInfo().Mode()
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = x.sink.Mkdir(name, mode)
	case tar.TypeReg:
		err = x.sink.WriteFile(name, mode, r, hdr.Size)
	case tar.TypeSymlink:
		err = x.sink.Symlink(hdr.Linkname, name)
	default:
		return x.sink.Special(hdr)
	}
	if err == nil {
		x.times = append(x.times, entryTime{name, hdr.ModTime})
	}
	return err
}

// setTimes sets the entries' modification times, last entry first, so
// a directory's is set after everything written into it.
func (x *extractor) setTimes() error {
	ts, ok := x.sink.(timeSetter)
	if !ok {
		return nil
	}
	for i := len(x.times) - 1; i >= 0; i-- {
		if err := ts.SetTime(x.times[i].name, x.times[i].mtime); err != nil {
			return fmt.Errorf("set the time of %s: %w", x.times[i].name, err)
		}
	}
	return nil
}

// check returns the entry's name as the sink takes it, or skip for the
// top directory itself ("." or "./"), or the refusal. With unchecked set
// it only normalizes the name.
func (x *extractor) check(hdr *tar.Header) (name string, skip bool, err error) {
	name = strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
	if x.unchecked {
		return name, name == "" || name == ".", nil
	}
	if hdr.Name == "." || hdr.Name == "./" {
		return "", true, nil
	}
	if x.files++; x.files > x.limits.MaxFiles {
		return "", false, fmt.Errorf("%w: more than %d entries", ErrTooLarge, x.limits.MaxFiles)
	}
	if err := checkName(hdr.Name, name); err != nil {
		return "", false, err
	}
	if x.seen[name] {
		return "", false, unsafeEntry(name, "appears twice")
	}
	x.seen[name] = true
	if err := checkType(hdr, name); err != nil {
		return "", false, err
	}
	if hdr.Typeflag == tar.TypeReg {
		if hdr.Size < 0 || hdr.Size > x.limits.MaxBytes-x.bytes {
			return "", false, fmt.Errorf("%w: %q would bring the files over %d bytes", ErrTooLarge, name, x.limits.MaxBytes)
		}
		x.bytes += hdr.Size
	}
	return name, false, nil
}

// checkName refuses a name that is absolute, has "." or ".." or empty
// elements, a NUL, or is too long. raw is the name as the archive has it.
func checkName(raw, name string) error {
	switch {
	case strings.HasPrefix(raw, "/"):
		return unsafeEntry(raw, "absolute path")
	case len(raw) > maxName:
		return unsafeEntry(raw[:64]+"...", "name longer than %d bytes", maxName)
	case strings.ContainsRune(raw, 0):
		return unsafeEntry(raw, "NUL in the name")
	case strings.Count(name, "/") >= maxDepth:
		return unsafeEntry(raw[:64]+"...", "more than %d elements deep", maxDepth)
	case !fs.ValidPath(name) || name == ".":
		return unsafeEntry(raw, "not a local path (\"..\", \".\" or empty elements)")
	}
	return nil
}

// checkType admits regular files, directories and symlinks without
// setuid or setgid bits, and symlink targets that are short and NUL-free.
func checkType(hdr *tar.Header, name string) error {
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink:
		if hdr.Linkname == "" || len(hdr.Linkname) > maxName || strings.ContainsRune(hdr.Linkname, 0) {
			return unsafeEntry(name, "symlink target empty, too long or with NUL")
		}
	default:
		return unsafeEntry(name, "type %q is not a regular file, directory or symlink", hdr.Typeflag)
	}
	if hdr.Mode&(cISUID|cISGID) != 0 {
		return unsafeEntry(name, "setuid or setgid bit (mode %o)", hdr.Mode)
	}
	return nil
}

// The tar header mode bits of setuid and setgid.
const (
	cISUID = 0o4000
	cISGID = 0o2000
)
