package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is the signed statement "the log named Origin has Size
// records and this tree hash". Its text is the C2SP checkpoint body:
//
//	<origin>
//	<size>
//	<base64 tree hash>
//
// signed as a note by the key whose name is the origin.
type Checkpoint struct {
	Origin string
	Size   int64
	Hash   tlog.Hash
}

// Errors of checkpoint handling; callers branch on them with errors.Is.
var (
	// ErrSignature: the checkpoint is not signed by the pinned key.
	ErrSignature = errors.New("audit checkpoint signature")
	// ErrMalformed: the checkpoint text does not parse.
	ErrMalformed = errors.New("audit checkpoint malformed")
)

// Text returns the checkpoint body.
func (c Checkpoint) Text() string {
	return fmt.Sprintf("%s\n%d\n%s\n", c.Origin, c.Size, base64.StdEncoding.EncodeToString(c.Hash[:]))
}

// SignCheckpoint returns c as a signed note.
func SignCheckpoint(c Checkpoint, s note.Signer) ([]byte, error) {
	if c.Origin != s.Name() {
		return nil, fmt.Errorf("audit: checkpoint origin %q is not the signer %q", c.Origin, s.Name())
	}
	return note.Sign(&note.Note{Text: c.Text()}, s)
}

// OpenCheckpoint verifies msg with v and parses it. The origin line must
// be v's name, so a checkpoint of another log signed by another key never
// passes for this one.
func OpenCheckpoint(msg []byte, v note.Verifier) (Checkpoint, error) {
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrSignature, err)
	}
	return parseCheckpointText(n.Text, v.Name())
}

// parseCheckpointText parses a checkpoint body whose origin must be name.
func parseCheckpointText(text, name string) (Checkpoint, error) {
	lines := strings.SplitN(text, "\n", 4)
	if len(lines) != 4 || lines[3] != "" {
		return Checkpoint{}, fmt.Errorf("%w: want exactly three lines", ErrMalformed)
	}
	if lines[0] != name {
		return Checkpoint{}, fmt.Errorf("%w: origin %q is not the key name %q", ErrMalformed, lines[0], name)
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		return Checkpoint{}, fmt.Errorf("%w: size %q", ErrMalformed, lines[1])
	}
	h, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(h) != tlog.HashSize {
		return Checkpoint{}, fmt.Errorf("%w: tree hash %q", ErrMalformed, lines[2])
	}
	c := Checkpoint{Origin: lines[0], Size: size}
	copy(c.Hash[:], h)
	return c, nil
}

// GenerateKey returns a new Ed25519 signing key and its verifier key in
// note format, for a log named name.
func GenerateKey(name string) (skey, vkey string, err error) {
	return note.GenerateKey(nil, name)
}

// LoadSigner parses a note signing key and derives its verifier, so a log
// opened with only the private key can still check its own checkpoints.
func LoadSigner(skey []byte) (note.Signer, note.Verifier, error) {
	text := string(bytes.TrimSpace(skey))
	s, err := note.NewSigner(text)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: signing key: %w", err)
	}
	// PRIVATE+KEY+<name>+<hash>+<base64(alg || seed)>
	parts := strings.SplitN(text, "+", 5)
	if len(parts) != 5 {
		return nil, nil, errors.New("audit: signing key is not PRIVATE+KEY+name+hash+key")
	}
	raw, err := base64.StdEncoding.DecodeString(parts[4])
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != 1 {
		return nil, nil, errors.New("audit: signing key is not an Ed25519 note key")
	}
	pub := ed25519.NewKeyFromSeed(raw[1:]).Public().(ed25519.PublicKey)
	vkey, err := note.NewEd25519VerifierKey(s.Name(), pub)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: derive verifier: %w", err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: derive verifier: %w", err)
	}
	if v.KeyHash() != s.KeyHash() {
		return nil, nil, errors.New("audit: derived verifier does not match the signing key")
	}
	return s, v, nil
}

// LoadVerifier parses a note verifier key.
func LoadVerifier(vkey []byte) (note.Verifier, error) {
	v, err := note.NewVerifier(string(bytes.TrimSpace(vkey)))
	if err != nil {
		return nil, fmt.Errorf("audit: verifier key: %w", err)
	}
	return v, nil
}
