package acpmeta

import (
	"fmt"
	"path"
	"strings"
)

// KeyVerify is the `_meta` key of a terminal/create request that asks for
// a verified outcome: after the child exits the receiver hashes each named
// file, and the custodian's receipt is `verified` only when every digest
// matches (otherwise `failed`; without this key an exit 0 is
// `needs_review`).
const KeyVerify = "tether/verify"

// MaxVerifyFiles bounds the files one request may ask to verify.
const MaxVerifyFiles = 64

// Verify is the value of `_meta["tether/verify"]`: expected lowercase hex
// SHA-256 by path relative to the tuple's root.
type Verify struct {
	Files map[string]string `json:"files"`
}

// Validate checks every path and digest.
func (v Verify) Validate() error {
	if len(v.Files) == 0 || len(v.Files) > MaxVerifyFiles {
		return fmt.Errorf("%w: %s: files must name 1..%d paths", ErrMeta, KeyVerify, MaxVerifyFiles)
	}
	for p, d := range v.Files {
		switch {
		case p == "" || strings.IndexByte(p, 0) >= 0 || path.IsAbs(p) || path.Clean(p) != p ||
			p == ".." || strings.HasPrefix(p, "../"):
			return fmt.Errorf("%w: %s: %q is not a clean relative path inside the root", ErrMeta, KeyVerify, p)
		case !ValidDigest(d):
			return fmt.Errorf("%w: %s: digest for %q is not a lowercase hex SHA-256", ErrMeta, KeyVerify, p)
		}
	}
	return nil
}

// VerifyFromMeta returns the verify request in meta. ok is false when the
// key is absent; a present but malformed value is an error.
func VerifyFromMeta(meta map[string]any) (v Verify, ok bool, err error) {
	raw, ok := meta[KeyVerify]
	if !ok {
		return Verify{}, false, nil
	}
	if err := remarshal(raw, &v); err != nil {
		return Verify{}, true, fmt.Errorf("%w: %s: %w", ErrMeta, KeyVerify, err)
	}
	if err := v.Validate(); err != nil {
		return Verify{}, true, err
	}
	return v, true, nil
}

// Meta returns v as a `_meta` map.
func (v Verify) Meta() map[string]any { return map[string]any{KeyVerify: v} }

// KeyFile is the `_meta` key the custodian sets on fs/read_text_file and
// fs/write_text_file responses: the SHA-256 and size of the whole file as
// the receiver read or wrote it, so an edit can name its precondition
// without hashing a partial read.
const KeyFile = "tether/file"

// File is the value of `_meta["tether/file"]`.
type File struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Meta returns f as a `_meta` map.
func (f File) Meta() map[string]any { return map[string]any{KeyFile: f} }

// FileFromMeta returns the file digest in meta; ok is false when absent.
func FileFromMeta(meta map[string]any) (f File, ok bool, err error) {
	raw, ok := meta[KeyFile]
	if !ok {
		return File{}, false, nil
	}
	if err := remarshal(raw, &f); err != nil || !ValidDigest(f.SHA256) || f.Size < 0 {
		return File{}, true, fmt.Errorf("%w: %s malformed", ErrMeta, KeyFile)
	}
	return f, true, nil
}
