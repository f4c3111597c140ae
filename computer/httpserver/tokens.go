package httpserver

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
)

// Token format: TokenPrefix and the hex of 32 random bytes. The token
// file keeps only the SHA-256 of those 32 bytes.
const (
	TokenPrefix     = "tct_"
	tokenBytes      = 32
	maxTokenFile    = 1 << 20
	maxTokens       = 4096
	tokenFileMode   = 0o600
	tokenFileLocked = ".lock"
)

// ErrTokenFile is wrapped by every refusal of the token file (unreadable,
// malformed, writable by group or others, not a regular file).
var ErrTokenFile = errors.New("token file")

var ownerPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$`)

// TokenEntry is one stored token: the hex SHA-256 of its secret bytes,
// the owner it acts as, and whether it is an admin (sees every owner's
// computers).
type TokenEntry struct {
	SHA256 string `json:"sha256"`
	Owner  string `json:"owner"`
	Admin  bool   `json:"admin,omitempty"`
}

// tokenFile is the token file's document.
type tokenFile struct {
	Tokens []TokenEntry `json:"tokens"`
}

// CheckOwner refuses an owner name outside ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$.
func CheckOwner(owner string) error {
	if !ownerPattern.MatchString(owner) {
		return fmt.Errorf("owner %q does not match %s", owner, ownerPattern)
	}
	return nil
}

// AddToken makes a new token for owner, stores its hash in the token file
// at path (created 0600 when missing, replaced atomically under an
// exclusive lock on path+".lock") and returns the token, which is shown
// once and stored nowhere.
func AddToken(path, owner string, admin bool) (string, error) {
	if err := CheckOwner(owner); err != nil {
		return "", err
	}
	var raw [tokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	sum := sha256.Sum256(raw[:])
	entry := TokenEntry{SHA256: hex.EncodeToString(sum[:]), Owner: owner, Admin: admin}
	unlock, err := lockFile(path + tokenFileLocked)
	if err != nil {
		return "", err
	}
	defer unlock()
	f, err := readTokenFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = tokenFile{}, nil
	}
	if err != nil {
		return "", err
	}
	if len(f.Tokens) >= maxTokens {
		return "", fmt.Errorf("%w: already %d tokens, at most %d", ErrTokenFile, len(f.Tokens), maxTokens)
	}
	f.Tokens = append(f.Tokens, entry)
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(path, append(b, '\n'), tokenFileMode, atomicfile.Options{}); err != nil {
		return "", fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	return TokenPrefix + hex.EncodeToString(raw[:]), nil
}

// lockFile takes an exclusive flock on path (created 0600); the returned
// function releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, tokenFileMode)
	if err != nil {
		return nil, fmt.Errorf("%w: lock: %w", ErrTokenFile, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: lock: %w", ErrTokenFile, err)
	}
	return func() { f.Close() }, nil
}

// readTokenFile reads and strictly decodes the token file, refusing one
// that is not a regular file or is writable by group or others.
func readTokenFile(path string) (tokenFile, error) {
	var f tokenFile
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return f, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return f, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 {
		return f, fmt.Errorf("%w: %s is %v: want a regular file not writable by group or others", ErrTokenFile, path, st.Mode())
	}
	if err := strictjson.Read(fh, maxTokenFile, &f); err != nil {
		return f, fmt.Errorf("%w: %s: %w", ErrTokenFile, path, err)
	}
	return f, checkTokenFile(f)
}

// checkTokenFile refuses an entry with a malformed hash or owner.
func checkTokenFile(f tokenFile) error {
	if len(f.Tokens) > maxTokens {
		return fmt.Errorf("%w: %d tokens, at most %d", ErrTokenFile, len(f.Tokens), maxTokens)
	}
	for i, e := range f.Tokens {
		if b, err := hex.DecodeString(e.SHA256); err != nil || len(b) != sha256.Size || strings.ToLower(e.SHA256) != e.SHA256 {
			return fmt.Errorf("%w: token %d: sha256 is not 64 lower-case hex digits", ErrTokenFile, i)
		}
		if err := CheckOwner(e.Owner); err != nil {
			return fmt.Errorf("%w: token %d: %w", ErrTokenFile, i, err)
		}
	}
	return nil
}

// Tokens checks bearer tokens against the token file. It reads the file
// again when its size, time or inode changed, so a token added while the
// daemon runs works at its first use; a file that became unreadable or
// malformed admits no token until it is fixed (fail closed).
type Tokens struct {
	path string

	mu      sync.Mutex
	stamp   fileStamp
	entries []TokenEntry
	err     error
}

type fileStamp struct {
	ino, size, mtime int64
}

// OpenTokens reads the token file at path; it must exist and be valid.
func OpenTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.refresh(); err != nil {
		return nil, err
	}
	return t, nil
}

// refresh rereads the file when it changed.
func (t *Tokens) refresh() error {
	st, err := os.Lstat(t.path)
	if err != nil {
		t.entries, t.err, t.stamp = nil, fmt.Errorf("%w: %w", ErrTokenFile, err), fileStamp{}
		return t.err
	}
	s := fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.ino = int64(sys.Ino)
	}
	if s == t.stamp && t.err == nil {
		return nil
	}
	f, err := readTokenFile(t.path)
	if err != nil {
		t.entries, t.err, t.stamp = nil, err, fileStamp{}
		return err
	}
	t.entries, t.err, t.stamp = f.Tokens, nil, s
	return nil
}

// Lookup returns the caller a bearer token acts as. Every stored hash is
// compared in constant time; a malformed or unknown token is not found.
func (t *Tokens) Lookup(token string) (api.Caller, bool) {
	hexPart, ok := strings.CutPrefix(token, TokenPrefix)
	raw, err := hex.DecodeString(hexPart)
	if !ok || err != nil || len(raw) != tokenBytes {
		return api.Caller{}, false
	}
	sum := sha256.Sum256(raw)
	want := hex.EncodeToString(sum[:])
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refresh() != nil {
		return api.Caller{}, false
	}
	var found api.Caller
	hit := 0
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare([]byte(e.SHA256), []byte(want)) == 1 {
			found, hit = api.Caller{Owner: e.Owner, Admin: e.Admin}, 1
		}
	}
	return found, hit == 1
}
