package opstore

import (
	"errors"
	"fmt"
)

// Errors callers branch on with errors.Is.
var (
	// ErrConflict: the op key is already recorded for a different request
	// digest, or a request with the same key is still in flight.
	ErrConflict = errors.New("op key conflict")
	// ErrInvalid: the intent or receipt is malformed.
	ErrInvalid = errors.New("invalid op store record")
	// ErrCorrupt: the state on disk does not decode; the store refuses to
	// guess which keys were dispatched.
	ErrCorrupt = errors.New("op store corrupt")
	// ErrBroken: a durable write failed; the store refuses every further
	// dispatch because it can no longer promise at-most-once.
	ErrBroken = errors.New("op store broken")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("op store closed")
	// ErrLocked: another process holds the state directory.
	ErrLocked = errors.New("op store locked by another process")
	// ErrNotFound: no receipt for the key.
	ErrNotFound = errors.New("no receipt for op key")
)

// ConflictError says why an op key was refused. It wraps ErrConflict.
type ConflictError struct {
	OpKey    string
	InFlight bool   // a request with this key has no result yet
	Stored   string // the digest recorded for the key ("" when in flight)
	Got      string // the digest of the refused request
}

// Error names the key and why it was refused.
func (e *ConflictError) Error() string {
	if e.InFlight {
		return fmt.Sprintf("op key %s: a request with this key is still in flight", e.OpKey)
	}
	return fmt.Sprintf("op key %s: recorded for request digest %s, not %s", e.OpKey, e.Stored, e.Got)
}

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Unwrap() error { return ErrConflict }
