package signedfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
)

// Size bounds of the admission file.
const (
	// DefaultMaxBytes is the loader's size limit when none is configured.
	DefaultMaxBytes = 4 << 20
	// HardMaxBytes is the largest size limit a loader accepts: a file that
	// size holds a payload admission.DecodeSnapshot still accepts.
	HardMaxBytes = admission.MaxDocumentBytes
)

// Verify must read every envelope the loader may accept: this constant
// does not compile if HardMaxBytes exceeds signing.MaxEnvelopeBytes.
const _ = uint64(signing.MaxEnvelopeBytes - HardMaxBytes)

// Check names one trust check of the loader. A TrustError carries it; the
// message of every load failure names it.
type Check string

// The loader's checks, in the order it runs them.
const (
	CheckExists     Check = "exists"       // the directory and the file exist and can be opened
	CheckSymlink    Check = "no_symlink"   // no symlink in the directory path (openat2), none at the file (O_NOFOLLOW)
	CheckDirectory  Check = "directory"    // the directory is owned by the owner uid or root and not group/world-writable
	CheckRegular    Check = "regular_file" // the file is a regular file
	CheckOwner      Check = "owner"        // the file is owned by the configured uid
	CheckFileMode   Check = "file_mode"    // the file is not group/world-writable
	CheckSize       Check = "size"         // the file is not larger than the limit
	CheckSignature  Check = "signature"    // a DSSE envelope of PayloadType signed by the pinned key
	CheckSchema     Check = "schema"       // the payload is a strict, valid Snapshot
	CheckExpiry     Check = "not_expired"  // the snapshot's not_after has not passed
	CheckGeneration Check = "generation"   // not lower than the last seen; not reused for other content
)

// Sentinels, one per check, so callers can branch with errors.Is. Every
// TrustError also wraps ErrUntrusted; an expired one also wraps
// ErrGrantExpired.
var (
	ErrUntrusted       = errors.New("admission file not trusted")
	ErrFileMissing     = errors.New("admission file missing")
	ErrSymlink         = errors.New("admission file path has a symlink")
	ErrDirectory       = errors.New("admission directory not trusted")
	ErrNotRegular      = errors.New("admission file is not a regular file")
	ErrOwner           = errors.New("admission file has the wrong owner")
	ErrFileMode        = errors.New("admission file is group- or world-writable")
	ErrTooLarge        = errors.New("admission file too large")
	ErrSignature       = errors.New("admission file signature")
	ErrSchema          = errors.New("admission file schema")
	ErrSnapshotExpired = errors.New("admission snapshot expired")
	ErrRollback        = errors.New("admission generation rolled back")
)

var checkErr = map[Check]error{
	CheckExists: ErrFileMissing, CheckSymlink: ErrSymlink, CheckDirectory: ErrDirectory,
	CheckRegular: ErrNotRegular, CheckOwner: ErrOwner, CheckFileMode: ErrFileMode,
	CheckSize: ErrTooLarge, CheckSignature: ErrSignature, CheckSchema: ErrSchema,
	CheckExpiry: ErrSnapshotExpired, CheckGeneration: ErrRollback,
}

// TrustError is a failed loader check. Err, when set, is the underlying
// cause (for example a signing error).
type TrustError struct {
	Check  Check
	Path   string
	Detail string
	Err    error
}

// Error names the path, the failed check and the cause.
func (e *TrustError) Error() string {
	msg := fmt.Sprintf("admission file %s: check %s failed: %s", e.Path, e.Check, e.Detail)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap exposes ErrUntrusted, the check's sentinel, ErrGrantExpired for
// CheckExpiry, and the cause.
func (e *TrustError) Unwrap() []error {
	errs := []error{ErrUntrusted, checkErr[e.Check]}
	if e.Check == CheckExpiry {
		errs = append(errs, admission.ErrGrantExpired)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// LoaderConfig says what a trusted admission file is.
type LoaderConfig struct {
	// Path is the admission file, normally DIR/FileName. No component of
	// its directory may be a symlink.
	Path string
	// PublicKey is the pinned key the envelope must be signed by.
	PublicKey signing.PublicKey
	// OwnerUID is the uid that must own the file; the directory must be
	// owned by it or by root. Required: nil is refused, never "any".
	OwnerUID *uint32
	// MaxBytes bounds the file size; 0 means DefaultMaxBytes. At most
	// HardMaxBytes.
	MaxBytes int64
	// MinGeneration is a floor below which every snapshot is a rollback,
	// for callers that persist the last generation across restarts.
	MinGeneration uint64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Loader reads and checks the admission file. It remembers the highest
// generation it has accepted and refuses anything lower. It is safe for
// concurrent use; concurrent Loads run one at a time (see Load).
type Loader struct {
	cfg       LoaderConfig
	dir, name string

	// turn admits one Load at a time: read, checks and advance are one
	// step, so a Load overtaken by a newer publish cannot compare what it
	// read with a generation a later reader accepted.
	turn chan struct{}

	mu         sync.Mutex
	lastGen    uint64
	lastDigest string

	loads       atomic.Int64 // Load calls that reached the file, for tests
	afterChecks func()       // tests: runs between the checks and advance
}

// Loaded is a snapshot that passed every check, with the file it came from.
type Loaded struct {
	Snapshot admission.Snapshot
	SHA256   string // hex SHA-256 of the file's bytes
	Size     int64
	stamp    stamp
}

// ErrLoaderConfig is wrapped by NewLoader's refusals.
var ErrLoaderConfig = errors.New("admission loader config")

// NewLoader validates cfg and returns a Loader.
func NewLoader(cfg LoaderConfig) (*Loader, error) {
	switch {
	case cfg.Path == "" || !filepath.IsAbs(cfg.Path):
		return nil, fmt.Errorf("%w: path %q is not absolute", ErrLoaderConfig, cfg.Path)
	case cfg.PublicKey.KeyID() == "":
		return nil, fmt.Errorf("%w: no pinned public key", ErrLoaderConfig)
	case cfg.OwnerUID == nil:
		return nil, fmt.Errorf("%w: owner uid is required", ErrLoaderConfig)
	case cfg.MaxBytes < 0 || cfg.MaxBytes > HardMaxBytes:
		return nil, fmt.Errorf("%w: max bytes %d not in [0, %d]", ErrLoaderConfig, cfg.MaxBytes, HardMaxBytes)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Path = filepath.Clean(cfg.Path)
	return &Loader{cfg: cfg, dir: filepath.Dir(cfg.Path), name: filepath.Base(cfg.Path),
		turn: make(chan struct{}, 1), lastGen: cfg.MinGeneration}, nil
}

// Path returns the file the loader reads.
func (l *Loader) Path() string { return l.cfg.Path }

// LastGeneration returns the highest generation accepted so far (or the
// configured floor).
func (l *Loader) LastGeneration() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastGen
}

func (l *Loader) fail(c Check, err error, format string, args ...any) *TrustError {
	return &TrustError{Check: c, Path: l.cfg.Path, Detail: fmt.Sprintf(format, args...), Err: err}
}

// Load runs every check on the file as it is now and returns the snapshot.
// On success the loader's last generation advances to the snapshot's.
// Any failure is a *TrustError; there is no fallback to an earlier file.
//
// Concurrent Loads run one at a time, each reading the file as it is after
// the previous one finished, so a Load that read generation N while
// another read N+1 just published cannot report N as a rollback: only a
// file that is lower than what an earlier, completed Load accepted is one.
// ctx bounds the wait for the turn.
func (l *Loader) Load(ctx context.Context) (*Loaded, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case l.turn <- struct{}{}:
		defer func() { <-l.turn }()
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a concurrent load: %w", ctx.Err())
	}
	l.loads.Add(1)
	data, info, err := l.read()
	if err != nil {
		return nil, err
	}
	ld, err := l.check(ctx, data)
	if err != nil {
		return nil, err
	}
	ld.stamp = info.stamp
	if l.afterChecks != nil {
		l.afterChecks()
	}
	if err := l.advance(ld); err != nil {
		return nil, err
	}
	return ld, nil
}

// read opens the file through the trust checks on the open descriptors and
// returns its bytes.
func (l *Loader) read() ([]byte, fileInfo, error) {
	dir, err := openDir(l.dir)
	if err != nil {
		return nil, fileInfo{}, l.openFailure(err, "directory "+l.dir)
	}
	defer dir.Close()
	if err := l.checkDir(dir); err != nil {
		return nil, fileInfo{}, err
	}
	f, err := openFileAt(dir, l.name)
	if err != nil {
		return nil, fileInfo{}, l.openFailure(err, "file")
	}
	defer f.Close()
	info, err := statFile(f)
	if err != nil {
		return nil, fileInfo{}, l.fail(CheckExists, err, "cannot stat the open file")
	}
	if err := l.checkFile(info); err != nil {
		return nil, fileInfo{}, err
	}
	data, err := io.ReadAll(io.LimitReader(f, l.cfg.MaxBytes+1))
	if err != nil {
		return nil, fileInfo{}, l.fail(CheckExists, err, "cannot read the file")
	}
	if int64(len(data)) > l.cfg.MaxBytes {
		return nil, fileInfo{}, l.fail(CheckSize, nil, "more than %d bytes were read", l.cfg.MaxBytes)
	}
	return data, info, nil
}

func (l *Loader) openFailure(err error, what string) *TrustError {
	switch {
	case errors.Is(err, syscall.ELOOP):
		return l.fail(CheckSymlink, err, "%s is reached through a symlink", what)
	case errors.Is(err, fs.ErrNotExist):
		return l.fail(CheckExists, err, "%s does not exist", what)
	}
	return l.fail(CheckExists, err, "cannot open %s", what)
}

// checkDir requires the open directory to be owned by the owner uid or
// root and writable by neither group nor others: whoever can write it can
// rename another file over the admission file.
func (l *Loader) checkDir(dir *os.File) error {
	info, err := statFile(dir)
	if err != nil {
		return l.fail(CheckDirectory, err, "cannot stat the directory %s", l.dir)
	}
	if info.uid != *l.cfg.OwnerUID && info.uid != 0 {
		return l.fail(CheckDirectory, nil, "directory %s is owned by uid %d, want %d or 0", l.dir, info.uid, *l.cfg.OwnerUID)
	}
	if info.perm&0o022 != 0 {
		return l.fail(CheckDirectory, nil, "directory %s has mode %04o: writable by group or others", l.dir, info.perm)
	}
	return nil
}

// checkFile runs the checks a stat of the open file answers.
func (l *Loader) checkFile(info fileInfo) error {
	switch {
	case !info.regular:
		return l.fail(CheckRegular, nil, "not a regular file")
	case info.uid != *l.cfg.OwnerUID:
		return l.fail(CheckOwner, nil, "owned by uid %d, want %d", info.uid, *l.cfg.OwnerUID)
	case info.perm&0o022 != 0:
		return l.fail(CheckFileMode, nil, "mode %04o: writable by group or others", info.perm)
	case info.size > l.cfg.MaxBytes:
		return l.fail(CheckSize, nil, "%d bytes, limit %d", info.size, l.cfg.MaxBytes)
	}
	return nil
}

// check verifies the signature, decodes the payload and checks expiry.
func (l *Loader) check(ctx context.Context, data []byte) (*Loaded, error) {
	payload, err := signing.Verify(ctx, data, admission.PayloadType, l.cfg.PublicKey)
	if err != nil {
		return nil, l.fail(CheckSignature, err, "DSSE envelope")
	}
	snap, err := admission.DecodeSnapshot(payload)
	if err != nil {
		return nil, l.fail(CheckSchema, err, "payload refused")
	}
	if now := l.cfg.Now(); now.After(snap.NotAfter) {
		return nil, l.fail(CheckExpiry, nil, "snapshot generation %d expired at %s (now %s)",
			snap.Generation, rfc3339(snap.NotAfter), rfc3339(now))
	}
	sum := sha256.Sum256(data)
	return &Loaded{Snapshot: snap, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}, nil
}

// advance refuses a generation lower than the last accepted one, or the
// same generation with other content, and otherwise records it.
func (l *Loader) advance(ld *Loaded) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	gen := ld.Snapshot.Generation
	switch {
	case gen < l.lastGen:
		return l.fail(CheckGeneration, nil, "generation %d is lower than %d, already seen", gen, l.lastGen)
	case gen == l.lastGen && l.lastDigest != "" && ld.SHA256 != l.lastDigest:
		return l.fail(CheckGeneration, nil, "generation %d reused for different content (sha256 %s, seen %s)",
			gen, ld.SHA256, l.lastDigest)
	}
	l.lastGen, l.lastDigest = gen, ld.SHA256
	return nil
}

// rfc3339 formats an instant as the admission documents write it.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
