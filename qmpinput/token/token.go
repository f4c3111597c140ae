// Package token is the live view's token store: one-time links that give
// a person the view or control role for a bounded time. A link carries a
// token id and a 256-bit secret; the store keeps only the secret's
// SHA-256. The first exchange of a link marks it used, so a link that
// leaked after its owner opened it is worth nothing; revocation and
// expiry take effect on the next check of a request.
//
// The store is a JSON file in the state directory (statedir), shared by
// the CLI (mint, revoke, list) and the view server (exchange, checks):
// every change is made under an exclusive lock and written atomically.
package token

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Role is what a token lets its holder do.
type Role string

// Roles.
const (
	// RoleView watches the screen; its input never reaches the guest.
	RoleView Role = "view"
	// RoleControl may also take over input, hand back, pause and resume.
	RoleControl Role = "control"
)

// Bounds.
const (
	MaxTTL      = 24 * time.Hour
	MaxLabel    = 64
	MaxTokens   = 1024
	secretBytes = 32
	idBytes     = 8
)

// Errors callers branch on. Every refusal wraps one.
var (
	// ErrMalformed: a link or a secret is not in the minted format.
	ErrMalformed = errors.New("token malformed")
	// ErrUnknown: no token has that id, or the secret does not match.
	ErrUnknown = errors.New("token unknown")
	// ErrExpired: the token's time is up.
	ErrExpired = errors.New("token expired")
	// ErrRevoked: the token was revoked.
	ErrRevoked = errors.New("token revoked")
	// ErrUsed: the one-time link was already exchanged.
	ErrUsed = errors.New("token link already used")
	// ErrInvalid: a mint request outside the bounds (role, ttl, label).
	ErrInvalid = errors.New("token request invalid")
	// ErrStore: the token file is unreadable or malformed.
	ErrStore = errors.New("token store")
)

// Token is one stored token. The secret itself is never stored.
type Token struct {
	ID           string     `json:"id"`
	Role         Role       `json:"role"`
	Label        string     `json:"label,omitempty"`
	Created      time.Time  `json:"created"`
	Expires      time.Time  `json:"expires"`
	SecretSHA256 string     `json:"secret_sha256"`
	Exchanged    *time.Time `json:"exchanged,omitempty"`
	Revoked      *time.Time `json:"revoked,omitempty"`
}

// Actor is how the audit log and the page name the token's holder.
func (t Token) Actor() string {
	if t.Label != "" {
		return fmt.Sprintf("%s (token %s)", t.Label, t.ID)
	}
	return "token " + t.ID
}

// Live returns nil if t may be used at now, else ErrRevoked or ErrExpired.
func (t Token) Live(now time.Time) error {
	if t.Revoked != nil {
		return fmt.Errorf("%w: token %s at %s", ErrRevoked, t.ID, t.Revoked.Format(time.RFC3339))
	}
	if !now.Before(t.Expires) {
		return fmt.Errorf("%w: token %s at %s", ErrExpired, t.ID, t.Expires.Format(time.RFC3339))
	}
	return nil
}

// Secret is a minted link's credential: "ID.SECRET", ID 16 hex digits,
// SECRET 43 characters of unpadded base64url (32 bytes).
type Secret string

// parse splits and checks the format, returning the id and the secret's
// SHA-256.
func (s Secret) parse() (string, [32]byte, error) {
	id, sec, ok := strings.Cut(string(s), ".")
	raw, err := base64.RawURLEncoding.Strict().DecodeString(sec)
	if !ok || len(id) != 2*idBytes || !isLowerHex(id) || err != nil || len(raw) != secretBytes {
		return "", [32]byte{}, fmt.Errorf("%w: want ID.SECRET as minted", ErrMalformed)
	}
	return id, sha256.Sum256(raw), nil
}

func isLowerHex(s string) bool {
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// newSecret returns a fresh id, secret and the secret's SHA-256 (hex).
func newSecret() (string, Secret, string, error) {
	b := make([]byte, idBytes+secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", "", err
	}
	id := hex.EncodeToString(b[:idBytes])
	sum := sha256.Sum256(b[idBytes:])
	return id, Secret(id + "." + base64.RawURLEncoding.EncodeToString(b[idBytes:])), hex.EncodeToString(sum[:]), nil
}

// matches compares a secret's digest with the stored one in constant time.
func (t Token) matches(sum [32]byte) bool {
	want, err := hex.DecodeString(t.SecretSHA256)
	return err == nil && subtle.ConstantTimeCompare(want, sum[:]) == 1
}

func checkMint(role Role, ttl time.Duration, label string) error {
	if role != RoleView && role != RoleControl {
		return fmt.Errorf("%w: role %q (view or control)", ErrInvalid, role)
	}
	if ttl <= 0 || ttl > MaxTTL {
		return fmt.Errorf("%w: ttl %v outside (0, %v]", ErrInvalid, ttl, MaxTTL)
	}
	if len(label) > MaxLabel || strings.IndexFunc(label, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%w: label must be at most %d printable characters", ErrInvalid, MaxLabel)
	}
	return nil
}
