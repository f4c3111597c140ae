// Package bundle is the deployment contract of the visual-only QMP
// adapter: a DSSE envelope, signed with ed25519 by admission/signing, whose
// payload pins the guest (x86_64 Debian with Hyprland), the accelerator
// (tcg only), the SHA-256 of the QEMU binary, the firmware and the disk
// image, and the exact machine arguments. Verify checks the signature and
// every hash under a root directory before a launch; tether never
// downloads QEMU or disks.
package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/admission/strictjson"
)

// PayloadType is the DSSE payload type of a bundle manifest.
const PayloadType = "application/vnd.tether.qmp-bundle.v1+json"

// Schema is the manifest's schema name.
const Schema = "tether.qmp-bundle/v1"

// The only guest and accelerator this release accepts.
const (
	GuestArch    = "x86_64"
	GuestOS      = "debian"
	GuestDesktop = "hyprland"
	AccelTCG     = "tcg"
)

// Errors callers branch on.
var (
	// ErrManifest: the payload is not a strict manifest of this schema.
	ErrManifest = errors.New("bundle manifest invalid")
	// ErrGuest: the guest is not x86_64 Debian with Hyprland.
	ErrGuest = errors.New("bundle guest not pinned to x86_64 debian hyprland")
	// ErrAccelerator: the accelerator is not tcg (hvf and kvm are refused),
	// or a machine argument selects another one.
	ErrAccelerator = errors.New("bundle accelerator refused (tcg only)")
	// ErrArtifact: an artifact path escapes the root, is not a regular
	// file, or cannot be read.
	ErrArtifact = errors.New("bundle artifact unusable")
	// ErrHashMismatch: an artifact's SHA-256 differs from the manifest.
	ErrHashMismatch = errors.New("bundle artifact sha256 mismatch")
)

// Artifact is one pinned file, by path relative to the bundle root.
type Artifact struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// Guest names the pinned guest.
type Guest struct {
	Arch    string `json:"arch"`
	OS      string `json:"os"`
	Desktop string `json:"desktop"`
}

// Manifest is the signed payload.
type Manifest struct {
	Schema      string   `json:"schema"`
	Guest       Guest    `json:"guest"`
	Accelerator string   `json:"accelerator"`
	QEMU        Artifact `json:"qemu"`
	Firmware    Artifact `json:"firmware"`
	Disk        Artifact `json:"disk"`
	MachineArgs []string `json:"machine_args"`
}

// HashError names the artifact whose digest differs.
type HashError struct {
	Artifact string
	Want     string
	Got      string
}

func (e *HashError) Error() string {
	return fmt.Sprintf("%v: %s: manifest %s, file %s", ErrHashMismatch, e.Artifact, e.Want, e.Got)
}

func (e *HashError) Unwrap() error { return ErrHashMismatch }

// Sign validates m and returns its DSSE envelope signed by key.
func Sign(ctx context.Context, m Manifest, key signing.PrivateKey) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return signing.Sign(ctx, PayloadType, payload, key)
}

// Verify checks the envelope's signature under pub, decodes the manifest
// strictly, validates its pins, and checks every artifact's SHA-256 under
// root. The first failed check is named by the error.
func Verify(ctx context.Context, envelope []byte, pub signing.PublicKey, root string) (Manifest, error) {
	payload, err := signing.Verify(ctx, envelope, PayloadType, pub)
	if err != nil {
		return Manifest{}, fmt.Errorf("bundle signature: %w", err)
	}
	m, err := Decode(payload)
	if err != nil {
		return Manifest{}, err
	}
	if err := m.CheckArtifacts(ctx, root); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// Decode strictly decodes and validates a manifest payload.
func Decode(payload []byte) (Manifest, error) {
	var m Manifest
	if err := strictjson.Decode(payload, signing.MaxEnvelopeBytes, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	return m, m.Validate()
}

// Validate checks the schema, the guest, the accelerator, the artifact
// paths and digests, and that no machine argument picks another
// accelerator.
func (m Manifest) Validate() error {
	if m.Schema != Schema {
		return fmt.Errorf("%w: schema %q, want %q", ErrManifest, m.Schema, Schema)
	}
	if m.Guest != (Guest{GuestArch, GuestOS, GuestDesktop}) {
		return fmt.Errorf("%w: %+v", ErrGuest, m.Guest)
	}
	if m.Accelerator != AccelTCG {
		return fmt.Errorf("%w: %q", ErrAccelerator, m.Accelerator)
	}
	for _, a := range m.artifacts() {
		if err := a.art.validate(a.name); err != nil {
			return err
		}
	}
	if len(m.MachineArgs) == 0 {
		return fmt.Errorf("%w: machine_args missing", ErrManifest)
	}
	for _, arg := range m.MachineArgs {
		if strings.ContainsAny(arg, "\x00\n") {
			return fmt.Errorf("%w: machine argument with NUL or newline", ErrManifest)
		}
	}
	if err := checkVNCArgs(m.MachineArgs); err != nil {
		return err
	}
	return checkAccelArgs(m.MachineArgs)
}

type namedArtifact struct {
	name string
	art  Artifact
}

func (m Manifest) artifacts() []namedArtifact {
	return []namedArtifact{{"qemu", m.QEMU}, {"firmware", m.Firmware}, {"disk", m.Disk}}
}

func (a Artifact) validate(name string) error {
	if a.Path == "" || path.IsAbs(a.Path) || path.Clean(a.Path) != a.Path || a.Path == ".." || strings.HasPrefix(a.Path, "../") {
		return fmt.Errorf("%w: %s path %q must be relative, clean and inside the root", ErrArtifact, name, a.Path)
	}
	if b, err := hex.DecodeString(a.SHA256); err != nil || len(b) != sha256.Size || strings.ToLower(a.SHA256) != a.SHA256 {
		return fmt.Errorf("%w: %s sha256 %q is not 64 lowercase hex digits", ErrManifest, name, a.SHA256)
	}
	return nil
}

// CheckArtifacts hashes every artifact under root. Paths are opened
// through os.Root, so neither ".." nor a symlink can leave root; each must
// be a regular file.
func (m Manifest) CheckArtifacts(ctx context.Context, root string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("%w: root %s: %w", ErrArtifact, root, err)
	}
	defer r.Close()
	for _, a := range m.artifacts() {
		if err := ctx.Err(); err != nil {
			return err
		}
		got, err := hashIn(r, a.art.Path)
		if err != nil {
			return fmt.Errorf("%w: %s %s: %w", ErrArtifact, a.name, a.art.Path, err)
		}
		if got != a.art.SHA256 {
			return &HashError{Artifact: a.name, Want: a.art.SHA256, Got: got}
		}
	}
	return nil
}

func hashIn(r *os.Root, p string) (string, error) {
	st, err := r.Lstat(p)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file (%v)", st.Mode().Type())
	}
	f, err := r.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || !os.SameFile(fi, st) {
		return "", fs.ErrInvalid
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
