package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// entry is one member of a test archive.
type entry struct {
	hdr  tar.Header
	body []byte
}

func file(name string, mode int64, body string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body: []byte(body)}
}

func dirEntry(name string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}}
}

func symlink(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// tarZst builds a tar.zst archive of entries, with the encoder options.
func tarZst(t testing.TB, entries []entry, opts ...zstd.EOption) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, append([]zstd.EOption{zstd.WithEncoderConcurrency(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// naiveSink is the extractor a careless tool would be: names joined to
// base (an absolute name taken as it is), symlinks followed, set-id bits
// and device nodes kept, files truncated over what is there. Positive
// controls run attack archives through it to show they do harm.
type naiveSink struct{ base string }

func (s naiveSink) path(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(s.base, name)
}

func (s naiveSink) Mkdir(name string, mode fs.FileMode) error {
	return os.MkdirAll(s.path(name), mode.Perm())
}

func (s naiveSink) WriteFile(name string, mode fs.FileMode, r io.Reader, size int64) error {
	p := s.path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(f, r, size); err != nil {
		return err
	}
	return f.Chmod(mode)
}

func (s naiveSink) Symlink(target, name string) error { return os.Symlink(target, s.path(name)) }

func (s naiveSink) Special(hdr *tar.Header) error {
	p := s.path(hdr.Name)
	switch hdr.Typeflag {
	case tar.TypeLink:
		return os.Link(s.path(hdr.Linkname), p)
	case tar.TypeChar, tar.TypeBlock:
		mode := uint32(hdr.Mode&0o777) | unix.S_IFCHR
		if hdr.Typeflag == tar.TypeBlock {
			mode = uint32(hdr.Mode&0o777) | unix.S_IFBLK
		}
		return unix.Mknod(p, mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
	}
	return unsafeEntry(hdr.Name, "naive sink: type %q", hdr.Typeflag)
}

// importUnchecked extracts data into dir with every entry check off and
// no digest check, through sink s (naive, or a rootSink to show the
// os.Root layer alone).
func importUnchecked(data []byte, s sink, l Limits) error {
	x := newExtractor(s, l)
	x.unchecked = true
	_, err := importStream(context.Background(), bytes.NewReader(data), x, "")
	return err
}

// listTree lists every path beneath dir (relative), sorted.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}
