// Package signing signs and verifies DSSE envelopes with ed25519 keys held
// in PEM files. The admission file and the VM bundle manifest both use it.
//
// Key files: the private key is PEM "PRIVATE KEY" (PKCS #8) in a file of
// mode 0600 owned by the reading user; the public key is PEM "PUBLIC KEY"
// (PKIX SubjectPublicKeyInfo), the encoding openssl reads and writes. A key's
// ID is the lowercase hex SHA-256 of its PKIX DER encoding, so a verifier
// that pins the public key also pins the ID.
package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Errors callers branch on with errors.Is.
var (
	// ErrKeyFile: a key file cannot be opened, is not a regular file, or is
	// reached through a symlink.
	ErrKeyFile = errors.New("key file")
	// ErrKeyPermissions: a private key file is readable or writable by group
	// or others or owned by another user, or a public key file is writable
	// by group or others.
	ErrKeyPermissions = errors.New("key file permissions")
	// ErrKeyEncoding: a key file is not the PEM encoding of an ed25519 key.
	ErrKeyEncoding = errors.New("key encoding")
)

// maxKeyFile bounds how much of a key file is read; a PEM ed25519 key is
// about 120 bytes.
const maxKeyFile = 4096

// PublicKey is an ed25519 public key with its pinned ID.
type PublicKey struct {
	key ed25519.PublicKey
	id  string
}

// PrivateKey is an ed25519 private key. Its zero value is not usable.
type PrivateKey struct {
	key ed25519.PrivateKey
	pub PublicKey
}

// KeyPermError reports a key file whose mode or owner is refused.
type KeyPermError struct {
	Path string
	Mode fs.FileMode
	UID  uint32
	Why  string
}

// Error names the path, its mode and owner, and the rule it breaks.
func (e *KeyPermError) Error() string {
	return fmt.Sprintf("%s: %s: mode %04o owner %d: %s", ErrKeyPermissions, e.Path, e.Mode.Perm(), e.UID, e.Why)
}

// Unwrap makes errors.Is(err, ErrKeyPermissions) true.
func (e *KeyPermError) Unwrap() error { return ErrKeyPermissions }

// GenerateKey returns a fresh ed25519 key from crypto/rand.
func GenerateKey() (PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return PrivateKey{}, fmt.Errorf("generate ed25519 key: %w", err)
	}
	return newPrivateKey(priv), nil
}

func newPrivateKey(priv ed25519.PrivateKey) PrivateKey {
	return PrivateKey{key: priv, pub: NewPublicKey(priv.Public().(ed25519.PublicKey))}
}

// NewPublicKey wraps a raw ed25519 public key. It panics if pub is not
// ed25519.PublicKeySize bytes long, as crypto/ed25519 does.
func NewPublicKey(pub ed25519.PublicKey) PublicKey {
	if len(pub) != ed25519.PublicKeySize {
		panic("signing: bad ed25519 public key length")
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic("signing: marshal ed25519 public key: " + err.Error())
	}
	sum := sha256.Sum256(der)
	return PublicKey{key: append(ed25519.PublicKey(nil), pub...), id: hex.EncodeToString(sum[:])}
}

// Public returns the public half of k.
func (k PrivateKey) Public() PublicKey { return k.pub }

// KeyID returns the lowercase hex SHA-256 of the PKIX DER encoding of the key.
func (p PublicKey) KeyID() string { return p.id }

// Ed25519 returns a copy of the raw public key.
func (p PublicKey) Ed25519() ed25519.PublicKey { return append(ed25519.PublicKey(nil), p.key...) }

// Equal reports whether p and o are the same key.
func (p PublicKey) Equal(o PublicKey) bool { return p.key.Equal(o.key) }

// MarshalPEM returns the PEM "PUBLIC KEY" encoding of p.
func (p PublicKey) MarshalPEM() []byte {
	der, _ := x509.MarshalPKIXPublicKey(p.key) // cannot fail for ed25519
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// MarshalPEM returns the PEM "PRIVATE KEY" (PKCS #8) encoding of k. The
// result is secret.
func (k PrivateKey) MarshalPEM() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(k.key) // cannot fail for ed25519
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// ParsePublicKey decodes one PEM "PUBLIC KEY" block holding an ed25519 key.
func ParsePublicKey(data []byte) (PublicKey, error) {
	der, err := onePEMBlock(data, "PUBLIC KEY")
	if err != nil {
		return PublicKey{}, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return PublicKey{}, fmt.Errorf("%w: %w", ErrKeyEncoding, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return PublicKey{}, fmt.Errorf("%w: public key is %T, not ed25519", ErrKeyEncoding, k)
	}
	return NewPublicKey(pub), nil
}

// ParsePrivateKey decodes one PEM "PRIVATE KEY" (PKCS #8) block holding an
// ed25519 key.
func ParsePrivateKey(data []byte) (PrivateKey, error) {
	der, err := onePEMBlock(data, "PRIVATE KEY")
	if err != nil {
		return PrivateKey{}, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return PrivateKey{}, fmt.Errorf("%w: %w", ErrKeyEncoding, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return PrivateKey{}, fmt.Errorf("%w: private key is %T, not ed25519", ErrKeyEncoding, k)
	}
	return newPrivateKey(priv), nil
}

// onePEMBlock returns the bytes of the single PEM block of type typ in data;
// anything but whitespace around it is refused.
func onePEMBlock(data []byte, typ string) ([]byte, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrKeyEncoding)
	}
	if block.Type != typ {
		return nil, fmt.Errorf("%w: PEM block is %q, want %q", ErrKeyEncoding, block.Type, typ)
	}
	if len(block.Headers) != 0 {
		return nil, fmt.Errorf("%w: PEM headers are not allowed", ErrKeyEncoding)
	}
	for _, c := range rest {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return nil, fmt.Errorf("%w: data after the PEM block", ErrKeyEncoding)
		}
	}
	return block.Bytes, nil
}

// LoadPrivateKey reads a private key file. It refuses a symlink, a
// non-regular file, a file owned by another user than the effective uid,
// and any group or world permission bit.
func LoadPrivateKey(path string) (PrivateKey, error) {
	data, err := readKeyFile(path, checkPrivateMode)
	if err != nil {
		return PrivateKey{}, err
	}
	k, err := ParsePrivateKey(data)
	if err != nil {
		return PrivateKey{}, fmt.Errorf("private key %s: %w", path, err)
	}
	return k, nil
}

// LoadPublicKey reads a public key file. It refuses a symlink, a
// non-regular file and a file writable by group or others: a pinned key
// anyone can replace pins nothing.
func LoadPublicKey(path string) (PublicKey, error) {
	data, err := readKeyFile(path, checkPublicMode)
	if err != nil {
		return PublicKey{}, err
	}
	k, err := ParsePublicKey(data)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %s: %w", path, err)
	}
	return k, nil
}

func checkPrivateMode(path string, mode fs.FileMode, uid uint32) error {
	if mode.Perm()&0o077 != 0 {
		return &KeyPermError{Path: path, Mode: mode, UID: uid, Why: "private key is accessible by group or others (want 0600)"}
	}
	if euid := uint32(os.Geteuid()); uid != euid {
		return &KeyPermError{Path: path, Mode: mode, UID: uid, Why: fmt.Sprintf("private key is not owned by uid %d", euid)}
	}
	return nil
}

func checkPublicMode(path string, mode fs.FileMode, uid uint32) error {
	if mode.Perm()&0o022 != 0 {
		return &KeyPermError{Path: path, Mode: mode, UID: uid, Why: "public key is writable by group or others"}
	}
	return nil
}

// readKeyFile opens path without following a final symlink, checks the open
// file (not the path, so nothing can be swapped in between) and reads at
// most maxKeyFile bytes.
func readKeyFile(path string, check func(string, fs.FileMode, uint32) error) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symlink", ErrKeyFile, path)
		}
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrKeyFile, path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%w: %s: no owner information", ErrKeyFile, path)
	}
	if err := check(path, fi.Mode(), st.Uid); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrKeyFile, path, err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrKeyEncoding, path, maxKeyFile)
	}
	return data, nil
}

// WritePrivateKey creates path with mode 0600 (whatever the umask) and
// writes k to it. It refuses to replace an existing file, so a key is never
// clobbered by accident.
func WritePrivateKey(path string, k PrivateKey) error {
	return writeNewFile(path, k.MarshalPEM(), 0o600)
}

// WritePublicKey creates path with mode 0644 and writes p to it. It refuses
// to replace an existing file.
func WritePublicKey(path string, p PublicKey) error {
	return writeNewFile(path, p.MarshalPEM(), 0o644)
}

func writeNewFile(path string, data []byte, mode fs.FileMode) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("%w: create: %w", ErrKeyFile, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%w: close %s: %w", ErrKeyFile, path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("%w: chmod %s: %w", ErrKeyFile, path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("%w: write %s: %w", ErrKeyFile, path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%w: fsync %s: %w", ErrKeyFile, path, err)
	}
	return nil
}
