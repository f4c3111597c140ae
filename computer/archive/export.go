package archive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Export writes the tree of root to w as a tar.zst stream and returns
// its receipt: the SHA-256 and length of the bytes written to w, and the
// entries. Entries carry names relative to the root, permission bits
// only (no set-id bits), uid and gid 0 and whole-second modification
// times; symlinks are stored, never followed; sockets, fifos and device
// nodes are left out (Receipt.Skipped). Export a suspended computer: a
// file that changes or goes while it is read fails the export. The
// caller keeps root and w.
func Export(ctx context.Context, root *os.Root, w io.Writer) (Receipt, error) {
	hw := newHashWriter(w)
	zw, err := zstd.NewWriter(hw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return Receipt{}, err
	}
	tw := tar.NewWriter(zw)
	files, skipped, err := writeTree(ctx, tw, root)
	if err == nil {
		err = tw.Close()
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("export: %w", err)
	}
	return Receipt{SHA256: hw.sum(), Bytes: hw.n, Files: files, Skipped: skipped}, nil
}

// writeTree writes every entry beneath root (not root itself) to tw, in
// lexical order, and counts the entries written and skipped.
func writeTree(ctx context.Context, tw *tar.Writer, root *os.Root) (files, skipped int64, err error) {
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		wrote, err := writeEntry(tw, root, name)
		if err != nil {
			return err
		}
		if wrote {
			files++
		} else {
			skipped++
		}
		return nil
	})
	return files, skipped, err
}

// writeEntry writes one entry; it reports false for a type no archive
// carries. A regular file is opened first and described from the open
// file, so the header and the bytes are of the same file.
func writeEntry(tw *tar.Writer, root *os.Root, name string) (bool, error) {
	return writeEntryAs(tw, root, name, name)
}

// writeEntryAs is writeEntry with the entry named as in the stream.
func writeEntryAs(tw *tar.Writer, root *os.Root, name, as string) (bool, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return false, err
	}
	switch {
	case fi.Mode().IsDir():
		return true, tw.WriteHeader(header(fi, as+"/", tar.TypeDir, ""))
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := root.Readlink(name)
		if err != nil {
			return false, err
		}
		return true, tw.WriteHeader(header(fi, as, tar.TypeSymlink, target))
	case fi.Mode().IsRegular():
		return writeFile(tw, root, name, as)
	}
	return false, nil
}

func writeFile(tw *tar.Writer, root *os.Root, name, as string) (bool, error) {
	f, err := root.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("%s changed type during the export", name)
	}
	hdr := header(fi, as, tar.TypeReg, "")
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return false, err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return false, fmt.Errorf("%s: %w (did it shrink during the export?)", name, err)
	}
	return true, nil
}

// header describes an entry without anything of the host: no owner
// names or ids, no access or change times, no set-id bits.
func header(fi fs.FileInfo, name string, typ byte, link string) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Linkname: link,
		Mode:     int64(fi.Mode().Perm()),
		ModTime:  fi.ModTime().Truncate(time.Second),
		Format:   tar.FormatPAX,
	}
}

// hashWriter passes writes to w and hashes and counts them.
type hashWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func newHashWriter(w io.Writer) *hashWriter { return &hashWriter{w: w, h: sha256.New()} }

func (hw *hashWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	hw.n += int64(n)
	return n, err
}

func (hw *hashWriter) sum() string { return hex.EncodeToString(hw.h.Sum(nil)) }
