package archive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

// maxWindow bounds the zstd window a stream may ask the decoder for
// (Export's encoder uses 8 MiB).
const maxWindow = 64 << 20

// ImportOptions say what an import expects and whom its files belong to.
type ImportOptions struct {
	// SHA256 is the expected lowercase hex SHA-256 of the whole stream,
	// as Export's receipt has it. Required.
	SHA256 string
	// Owner owns every file, directory and symlink written; the zero
	// Owner is root, so set the computer's uid and gid.
	Owner Owner
	// Limits cap the files and the stream; zero fields take defaults.
	Limits Limits
}

// Import extracts the tar.zst stream r into dir, which must be an empty
// directory, and checks that the stream's SHA-256 is opts.SHA256. The
// stream is read to its end (what follows the archive is covered by the
// digest too). On any refusal (an unsafe entry, a cap, a digest
// mismatch) or error, everything written into dir is removed and dir is
// left empty. The files are on disk before the digest is known, so dir
// must not be in use by anything until Import returns.
func Import(ctx context.Context, r io.Reader, dir string, opts ImportOptions) (Receipt, error) {
	if err := checkDigest(opts.SHA256); err != nil {
		return Receipt{}, err
	}
	root, err := openEmpty(dir)
	if err != nil {
		return Receipt{}, err
	}
	defer root.Close()
	x := newExtractor(newRootSink(root, "", opts.Owner), opts.Limits)
	rc, err := importStream(ctx, r, x, opts.SHA256)
	if err != nil {
		if rerr := removeContents(root); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove what the import wrote: %w", rerr))
		}
		return Receipt{}, fmt.Errorf("import into %s: %w", dir, err)
	}
	return rc, nil
}

// importStream extracts r with x and checks the stream's digest against
// want (when want is not empty; only tests pass an empty want).
func importStream(ctx context.Context, r io.Reader, x *extractor, want string) (Receipt, error) {
	hr := &hashReader{r: r, h: sha256.New(), max: x.limits.MaxStreamBytes}
	zr, err := zstd.NewReader(hr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxWindow),
		zstd.WithDecoderMaxMemory(maxWindow))
	if err != nil {
		return Receipt{}, err
	}
	defer zr.Close()
	if err := x.run(ctx, tar.NewReader(zr)); err != nil {
		return Receipt{}, err
	}
	if _, err := io.Copy(io.Discard, hr); err != nil {
		return Receipt{}, fmt.Errorf("read the rest of the stream: %w", err)
	}
	got := hex.EncodeToString(hr.h.Sum(nil))
	if want != "" && got != want {
		return Receipt{}, fmt.Errorf("%w: got %s, want %s", ErrDigestMismatch, got, want)
	}
	return Receipt{SHA256: got, Bytes: hr.n, Files: x.files}, nil
}

// checkDigest refuses a digest that is not 64 lowercase hex digits.
func checkDigest(d string) error {
	if len(d) != 2*sha256.Size {
		return fmt.Errorf("%w: expected digest %q is not 64 hex digits", ErrDigestMismatch, d)
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: expected digest %q is not lowercase hex", ErrDigestMismatch, d)
		}
	}
	return nil
}

// openEmpty opens dir as a root and checks it is an empty directory.
// The caller closes the root.
func openEmpty(dir string) (*os.Root, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	d, err := root.Open(".")
	if err == nil {
		_, err = d.Readdirnames(1)
		d.Close()
	}
	switch {
	case errors.Is(err, io.EOF):
		return root, nil
	case err == nil:
		err = fmt.Errorf("%w: %s is not empty", ErrNotEmpty, dir)
	}
	root.Close()
	return nil, err
}

// hashReader passes reads from r and hashes and counts them; past max
// bytes it fails with ErrTooLarge.
type hashReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	max int64
}

func (hr *hashReader) Read(p []byte) (int, error) {
	if hr.n >= hr.max {
		var b [1]byte
		if n, err := io.ReadFull(hr.r, b[:]); n == 0 {
			return 0, err // io.EOF at the end
		}
		return 0, fmt.Errorf("%w: stream over %d bytes", ErrTooLarge, hr.max)
	}
	if int64(len(p)) > hr.max-hr.n {
		p = p[:hr.max-hr.n]
	}
	n, err := hr.r.Read(p)
	hr.h.Write(p[:n])
	hr.n += int64(n)
	return n, err
}
