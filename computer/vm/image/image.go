// Package image finds and verifies the VM computers' guest image: a
// read-only ext4 root built from Debian packages by ci/guestimage, with a
// manifest beside it naming every package, its version and its .deb's
// SHA-256, and the image's own SHA-256. Nothing here downloads anything:
// an image that is absent is absent (ErrAbsent), and the provisioner then
// boots its initramfs alone.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Format is the manifest's format string.
const Format = "tether-guestimage/1"

// ManifestName and the cache layout ci/guestimage writes.
const (
	ManifestName = "manifest.json"
	// CurrentLink is the cache entry naming the newest build.
	CurrentLink = "current"
)

// DefaultCache is where ci/guestimage builds (TETHER_CACHE overrides the
// cache's root, as for the kernels).
func DefaultCache() string {
	root := os.Getenv("TETHER_CACHE")
	if root == "" {
		root = "/var/cache/tether"
	}
	return filepath.Join(root, "guestimage")
}

// DefaultDir is the current build in the default cache.
func DefaultDir() string { return filepath.Join(DefaultCache(), CurrentLink) }

// Errors callers branch on.
var (
	// ErrAbsent: no image was built (run ci/guestimage).
	ErrAbsent = errors.New("guest image: absent")
	// ErrManifest: the manifest is malformed.
	ErrManifest = errors.New("guest image: manifest")
	// ErrDigest: the image's SHA-256 is not the manifest's.
	ErrDigest = errors.New("guest image: digest mismatch")
)

// Package is one Debian package unpacked into the image.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Deb     string `json:"deb"`
	SHA256  string `json:"sha256"`
}

// Manifest is DIR/manifest.json.
type Manifest struct {
	Format          string    `json:"format"`
	Image           string    `json:"image"` // file name in DIR
	ImageSHA256     string    `json:"image_sha256"`
	ImageBytes      int64     `json:"image_bytes"`
	SourceDateEpoch int64     `json:"source_date_epoch"`
	UUID            string    `json:"uuid"`
	Packages        []Package `json:"packages"`
}

// maxManifestBytes bounds a manifest (a few hundred packages).
const maxManifestBytes = 1 << 20

var (
	hexSHA256   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	plainName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9+.~_:-]{0,254}$`)
	debName     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9+.~_%-]{0,250}\.deb$`) // apt-get download writes ':' as %3a
	uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// DecodeManifest strictly decodes and validates a manifest.
func DecodeManifest(data []byte) (Manifest, error) {
	var m Manifest
	if err := strictjson.Decode(data, maxManifestBytes, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	return m, m.Validate()
}

// Validate reports the first invalid field.
func (m Manifest) Validate() error {
	switch {
	case m.Format != Format:
		return fmt.Errorf("%w: format %q, want %q", ErrManifest, m.Format, Format)
	case !plainName.MatchString(m.Image) || m.Image == "." || m.Image == "..":
		return fmt.Errorf("%w: image %q is not a plain file name", ErrManifest, m.Image)
	case !hexSHA256.MatchString(m.ImageSHA256):
		return fmt.Errorf("%w: image_sha256 %q is not a SHA-256", ErrManifest, m.ImageSHA256)
	case m.ImageBytes <= 0 || m.ImageBytes%4096 != 0:
		return fmt.Errorf("%w: image_bytes %d is not a positive multiple of 4096", ErrManifest, m.ImageBytes)
	case !uuidPattern.MatchString(m.UUID):
		return fmt.Errorf("%w: uuid %q", ErrManifest, m.UUID)
	case len(m.Packages) == 0:
		return fmt.Errorf("%w: no packages", ErrManifest)
	}
	seen := map[string]bool{}
	for i, p := range m.Packages {
		if !plainName.MatchString(p.Name) || !plainName.MatchString(p.Version) || !debName.MatchString(p.Deb) || !hexSHA256.MatchString(p.SHA256) {
			return fmt.Errorf("%w: packages[%d] (%q %q)", ErrManifest, i, p.Name, p.Version)
		}
		if seen[p.Name] {
			return fmt.Errorf("%w: package %s twice", ErrManifest, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Has reports whether the manifest names package name.
func (m Manifest) Has(name string) bool {
	for _, p := range m.Packages {
		if p.Name == name {
			return true
		}
	}
	return false
}

// Image is a verified guest image.
type Image struct {
	Dir      string // the build's directory (symlinks resolved)
	Path     string // the ext4 file
	Manifest Manifest
}

// Digest is the image's SHA-256, "sha256:HEX".
func (i Image) Digest() string { return "sha256:" + i.Manifest.ImageSHA256 }

// Find reads dir's manifest without hashing the image: ErrAbsent if
// there is no manifest or no image.
func Find(dir string) (Image, error) {
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: %s (ci/guestimage builds it)", ErrAbsent, dir)
	}
	if err != nil {
		return Image{}, err
	}
	data, err := os.ReadFile(filepath.Join(real, ManifestName))
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: %s has no %s (ci/guestimage builds it)", ErrAbsent, real, ManifestName)
	}
	if err != nil {
		return Image{}, err
	}
	m, err := DecodeManifest(data)
	if err != nil {
		return Image{}, fmt.Errorf("%s: %w", real, err)
	}
	img := Image{Dir: real, Path: filepath.Join(real, m.Image), Manifest: m}
	st, err := os.Stat(img.Path)
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: %s", ErrAbsent, img.Path)
	}
	if err != nil {
		return Image{}, err
	}
	if !st.Mode().IsRegular() || st.Size() != m.ImageBytes {
		return Image{}, fmt.Errorf("%w: %s is %d bytes, the manifest says %d", ErrDigest, img.Path, st.Size(), m.ImageBytes)
	}
	return img, nil
}

// Load is Find, then Verify.
func Load(dir string) (Image, error) {
	img, err := Find(dir)
	if err != nil {
		return Image{}, err
	}
	return img, img.Verify()
}

// Verify hashes the image and compares it with the manifest.
func (i Image) Verify() error {
	f, err := os.Open(i.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash %s: %w", i.Path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != i.Manifest.ImageSHA256 {
		return fmt.Errorf("%w: %s is sha256:%s, the manifest says sha256:%s", ErrDigest, i.Path, got, i.Manifest.ImageSHA256)
	}
	return nil
}
