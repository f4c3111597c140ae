package archive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/tetherdev/tether/admission/strictjson"
)

// A disk export is what a VM computer exports: a tar.zst stream, like
// Export's, of exactly two regular files in this order,
//
//	tether-disk.json  the DiskManifest (at most maxDiskManifest bytes)
//	disk.raw          the computer's writable disk, DiskManifest.DiskBytes long
//
// and nothing after them. The disk is bytes to this package: nothing on
// the host mounts or parses the file system in it.
const (
	DiskManifestName = "tether-disk.json"
	DiskName         = "disk.raw"
	// DiskFormat is DiskManifest.Format.
	DiskFormat = "tether-vm-disk/1"
)

// maxDiskManifest bounds the manifest entry.
const maxDiskManifest = 4096

// DiskManifest says what a disk export's disk is.
type DiskManifest struct {
	Format string `json:"format"`
	// BaseImage is the digest ("sha256:HEX") of the read-only image the
	// disk is the writable layer of; an import boots the disk over
	// that image only.
	BaseImage string `json:"base_image"`
	// DiskBytes is the disk's size.
	DiskBytes int64 `json:"disk_bytes"`
	// DiskSHA256 is the lowercase hex SHA-256 of the disk's bytes.
	DiskSHA256 string `json:"disk_sha256"`
}

var imageDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// validate checks the manifest's fields, and its disk size against max.
func (m DiskManifest) validate(max int64) error {
	switch {
	case m.Format != DiskFormat:
		return unsafeEntry(DiskManifestName, "format %q, want %q", m.Format, DiskFormat)
	case !imageDigest.MatchString(m.BaseImage):
		return unsafeEntry(DiskManifestName, "base_image %q is not sha256:HEX", m.BaseImage)
	case checkDigest(m.DiskSHA256) != nil:
		return unsafeEntry(DiskManifestName, "disk_sha256 %q is not 64 lowercase hex digits", m.DiskSHA256)
	case m.DiskBytes <= 0:
		return unsafeEntry(DiskManifestName, "disk_bytes %d", m.DiskBytes)
	case m.DiskBytes > max:
		return fmt.Errorf("%w: disk_bytes %d is over %d", ErrTooLarge, m.DiskBytes, max)
	}
	return nil
}

// ExportDisk writes the disk export of disk (size bytes, read twice:
// once for its digest, once into the stream) over the image baseImage
// to w, and returns its receipt (Files counts the disk). The caller
// keeps disk and w, and must not let disk change meanwhile.
func ExportDisk(ctx context.Context, w io.Writer, baseImage string, disk io.ReaderAt, size int64) (Receipt, error) {
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, io.NewSectionReader(disk, 0, size)}); err != nil {
		return Receipt{}, fmt.Errorf("export the disk: hash it: %w", err)
	}
	man, err := json.Marshal(DiskManifest{Format: DiskFormat, BaseImage: baseImage, DiskBytes: size,
		DiskSHA256: hex.EncodeToString(h.Sum(nil))})
	if err != nil {
		return Receipt{}, err
	}
	hw := newHashWriter(w)
	zw, err := zstd.NewWriter(hw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return Receipt{}, err
	}
	tw := tar.NewWriter(zw)
	err = writeDiskEntries(ctx, tw, man, disk, size)
	if err == nil {
		err = tw.Close()
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("export the disk: %w", err)
	}
	return Receipt{SHA256: hw.sum(), Bytes: hw.n, Files: 1}, nil
}

func writeDiskEntries(ctx context.Context, tw *tar.Writer, man []byte, disk io.ReaderAt, size int64) error {
	now := time.Now().Truncate(time.Second)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: DiskManifestName, Mode: 0o644, Size: int64(len(man)), ModTime: now, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := tw.Write(man); err != nil {
		return err
	}
	hdr = &tar.Header{Typeflag: tar.TypeReg, Name: DiskName, Mode: 0o600, Size: size, ModTime: now, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, ctxReader{ctx, io.NewSectionReader(disk, 0, size)})
	if err == nil && n != size {
		err = fmt.Errorf("the disk is %d bytes, not %d (did it shrink?)", n, size)
	}
	return err
}

// DiskOptions say what ReadDisk accepts.
type DiskOptions struct {
	// SHA256 is the expected lowercase hex SHA-256 of the whole stream;
	// "" checks none (the caller checked it already).
	SHA256 string
	// MaxDiskBytes caps DiskManifest.DiskBytes. Required.
	MaxDiskBytes int64
	// Check, if set, is called with the manifest before any byte of the
	// disk is read (the caller checks the base image and the size); its
	// error ends the read.
	Check func(DiskManifest) error
	// MaxStreamBytes caps the stream; 0 is DefaultLimits'.
	MaxStreamBytes int64
}

// ReadDisk reads a disk export from r to its end, writes the disk's
// bytes to dst (io.Discard only checks), and returns the manifest and
// the receipt. It refuses (ErrUnsafeEntry, ErrTooLarge,
// ErrDigestMismatch) any other entry, name, type or order, a manifest
// that is not strictly a DiskManifest, a disk of another size or digest
// than the manifest's, and a stream whose digest is not opts.SHA256.
// What was written to dst before a refusal is the caller's to discard.
func ReadDisk(ctx context.Context, r io.Reader, opts DiskOptions, dst io.Writer) (DiskManifest, Receipt, error) {
	if opts.SHA256 != "" {
		if err := checkDigest(opts.SHA256); err != nil {
			return DiskManifest{}, Receipt{}, err
		}
	}
	if opts.MaxDiskBytes <= 0 {
		return DiskManifest{}, Receipt{}, errors.New("read the disk export: no MaxDiskBytes")
	}
	hr := &hashReader{r: r, h: sha256.New(), max: Limits{MaxStreamBytes: opts.MaxStreamBytes}.orDefault().MaxStreamBytes}
	zr, err := zstd.NewReader(hr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxWindow),
		zstd.WithDecoderMaxMemory(maxWindow))
	if err != nil {
		return DiskManifest{}, Receipt{}, err
	}
	defer zr.Close()
	man, err := readDiskEntries(ctx, tar.NewReader(ctxReader{ctx, zr}), opts, dst)
	if err != nil {
		return DiskManifest{}, Receipt{}, fmt.Errorf("read the disk export: %w", err)
	}
	if _, err := io.Copy(io.Discard, hr); err != nil {
		return DiskManifest{}, Receipt{}, fmt.Errorf("read the rest of the stream: %w", err)
	}
	got := hex.EncodeToString(hr.h.Sum(nil))
	if opts.SHA256 != "" && got != opts.SHA256 {
		return DiskManifest{}, Receipt{}, fmt.Errorf("%w: got %s, want %s", ErrDigestMismatch, got, opts.SHA256)
	}
	return man, Receipt{SHA256: got, Bytes: hr.n, Files: 1}, nil
}

// readDiskEntries reads the manifest, checks it, copies the disk to dst
// checking its size and digest, and refuses any entry after it.
func readDiskEntries(ctx context.Context, tr *tar.Reader, opts DiskOptions, dst io.Writer) (DiskManifest, error) {
	hdr, err := nextRegular(tr, DiskManifestName, maxDiskManifest)
	if err != nil {
		return DiskManifest{}, err
	}
	data, err := io.ReadAll(io.LimitReader(tr, maxDiskManifest+1))
	if err != nil {
		return DiskManifest{}, err
	}
	if int64(len(data)) != hdr.Size {
		return DiskManifest{}, unsafeEntry(DiskManifestName, "holds %d bytes, its header says %d", len(data), hdr.Size)
	}
	var man DiskManifest
	if err := strictjson.Decode(data, maxDiskManifest, &man); err != nil {
		return DiskManifest{}, unsafeEntry(DiskManifestName, "%v", err)
	}
	if err := man.validate(opts.MaxDiskBytes); err != nil {
		return DiskManifest{}, err
	}
	if opts.Check != nil {
		if err := opts.Check(man); err != nil {
			return DiskManifest{}, err
		}
	}
	if hdr, err = nextRegular(tr, DiskName, man.DiskBytes); err != nil {
		return DiskManifest{}, err
	}
	if hdr.Size != man.DiskBytes {
		return DiskManifest{}, unsafeEntry(DiskName, "is %d bytes, the manifest says %d", hdr.Size, man.DiskBytes)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(dst, h), io.LimitReader(tr, man.DiskBytes)); err != nil {
		return DiskManifest{}, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != man.DiskSHA256 {
		return DiskManifest{}, fmt.Errorf("%w: the disk is %s, the manifest says %s", ErrDigestMismatch, got, man.DiskSHA256)
	}
	if hdr, err := tr.Next(); err != io.EOF {
		if err == nil {
			return DiskManifest{}, unsafeEntry(hdr.Name, "an entry after %s", DiskName)
		}
		return DiskManifest{}, err
	}
	return man, nil
}

// nextRegular reads the next header and refuses anything but a regular
// file named name of at most max bytes.
func nextRegular(tr *tar.Reader, name string, max int64) (*tar.Header, error) {
	hdr, err := tr.Next()
	if err == io.EOF {
		return nil, unsafeEntry(name, "missing")
	}
	if err != nil {
		return nil, err
	}
	switch {
	case hdr.Name != name:
		return nil, unsafeEntry(hdr.Name, "want %s here", name)
	case hdr.Typeflag != tar.TypeReg:
		return nil, unsafeEntry(hdr.Name, "type %q, want a regular file", hdr.Typeflag)
	case hdr.Size > max:
		return nil, fmt.Errorf("%w: %s is %d bytes, over %d", ErrTooLarge, hdr.Name, hdr.Size, max)
	case hdr.Size < 0:
		return nil, unsafeEntry(hdr.Name, "size %d", hdr.Size)
	}
	return hdr, nil
}

// ctxReader fails reads once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
