package opstore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Keys is the operation-key contract both backends keep: the
// single-machine Store (bbolt) and the fleet's EtcdStore.
//
//   - Same key and same request digest: the original receipt, byte for
//     byte, and nothing runs again.
//   - Same key, another digest: a *ConflictError (ErrConflict).
//   - A duplicate while the first is in flight: a *ConflictError with
//     InFlight set.
//   - A key whose fate is unknown (its holder died): Interrupted, never
//     dispatched again.
type Keys interface {
	// Begin makes the intent durable before a dispatch; see Store.Begin.
	Begin(ctx context.Context, in Intent) (*Ticket, *Receipt, error)
	// BeginIdempotent claims a key for a request whose repetition changes
	// nothing; see Store.BeginIdempotent.
	BeginIdempotent(ctx context.Context, in Intent) (*Ticket, *Receipt, error)
	// Complete moves a Pending receipt to its final outcome.
	Complete(ctx context.Context, key string, fn func(r *Receipt)) error
	// Get returns key's receipt exactly as stored (ErrNotFound).
	Get(key string) ([]byte, error)
	// List returns every receipt the store holds.
	List() ([]*Receipt, error)
	// KeepForLease keeps a tuple's keys until notAfter plus the retention.
	KeepForLease(ctx context.Context, tupleSHA256 string, notAfter time.Time) error
	// Flush waits until every result recorded so far is durable.
	Flush(ctx context.Context) error
	// Prune deletes final receipts whose retention has passed.
	Prune(ctx context.Context) error
	// Close releases the store; safe twice.
	Close() error
}

var (
	_ Keys = (*Store)(nil)
	_ Keys = (*EtcdStore)(nil)
)

// stampIntent validates in, refuses an ended ctx, and sets in's
// DispatchedAt and RetainUntil (the later of now and the lease, plus the
// retention).
func stampIntent(ctx context.Context, in *Intent, now time.Time, retention time.Duration) error {
	if err := in.validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("begin op key %s: %w", in.OpKey, err)
	}
	in.DispatchedAt = now.UTC()
	in.RetainUntil = laterOf(in.DispatchedAt, in.LeaseNotAfter).Add(retention)
	return nil
}

// answerStored is what a Begin of in gets when prev is already recorded
// for its key: a replay of prev, or a conflict.
func answerStored(prev *Receipt, in *Intent) (*Receipt, error) {
	switch {
	case prev.RequestSHA256 != in.RequestSHA256:
		return nil, &ConflictError{OpKey: in.OpKey, Stored: prev.RequestSHA256, Got: in.RequestSHA256}
	case !prev.HasResult():
		return nil, &ConflictError{OpKey: in.OpKey, InFlight: true, Got: in.RequestSHA256}
	}
	return prev, nil
}

// Errors of the fleet store; callers branch on them with errors.Is.
var (
	// ErrFenced: the session is no longer this store's: its ownership
	// lease expired or another custodian claimed it. Nothing was recorded.
	ErrFenced = errors.New("op store fenced: this custodian no longer owns the session")
	// ErrNotClaimed: the session was never claimed by this store (Claim).
	ErrNotClaimed = errors.New("op store: session not claimed by this custodian")
	// ErrOwned: another live custodian owns the session. *OwnedError
	// names it.
	ErrOwned = errors.New("op store: session owned by another custodian")
	// ErrUnavailable: etcd did not answer in time; whether the write took
	// effect is unknown, and the request must not be dispatched.
	ErrUnavailable = errors.New("op store unavailable")
)

// OwnedError names the custodian that owns a session another tried to
// claim. It wraps ErrOwned.
type OwnedError struct {
	SessionID string
	Owner     string // the owner's name (EtcdOptions.Name)
	Token     uint64 // the owner's fencing token
}

// Error names the session and its owner.
func (e *OwnedError) Error() string {
	return fmt.Sprintf("session %q is owned by custodian %q (token %d)", e.SessionID, e.Owner, e.Token)
}

// Unwrap makes errors.Is(err, ErrOwned) hold.
func (e *OwnedError) Unwrap() error { return ErrOwned }
