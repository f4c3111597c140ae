package opstore

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tetherdev/tether/admission/acpmeta"
)

// leasesBucket maps a tuple's SHA-256 to the latest lease end recorded for
// it (RFC 3339), so that a key dispatched under an earlier lease is kept as
// long as the lease as extended.
var leasesBucket = []byte("leases")

// KeepForLease records durably (one bbolt commit) that the lease of the
// tuple tupleSHA256 now ends at notAfter. From then on no key dispatched
// for that tuple is pruned before notAfter plus the retention, whatever
// lease it was dispatched under: a retry inside an extended lease is
// always answered from its receipt. An earlier notAfter than the one
// recorded changes nothing. Call it before the extension takes effect;
// on error the extension must be refused.
func (s *Store) KeepForLease(ctx context.Context, tupleSHA256 string, notAfter time.Time) error {
	if !acpmeta.ValidDigest(tupleSHA256) {
		return fmt.Errorf("%w: tuple digest is not a lowercase hex SHA-256", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record lease of tuple %s: %w", tupleSHA256, err)
	}
	s.mu.Lock()
	err := s.usableLocked()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(leasesBucket)
		if cur, ok := leaseEnd(b, tupleSHA256); ok && !notAfter.After(cur) {
			return nil
		}
		return b.Put([]byte(tupleSHA256), []byte(notAfter.UTC().Format(time.RFC3339Nano)))
	})
	if err != nil {
		return fmt.Errorf("record lease of tuple %s for key retention: %w", tupleSHA256, err)
	}
	return nil
}

// leaseEnd returns the lease end recorded for a tuple. An entry that does
// not decode reads as "forever": the store keeps keys it cannot decide on
// rather than forget one and run a retry twice.
func leaseEnd(b *bolt.Bucket, tupleSHA256 string) (time.Time, bool) {
	v := b.Get([]byte(tupleSHA256))
	if v == nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(v))
	if err != nil {
		return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), true
	}
	return t, true
}

// retainUntil is when r may be pruned: its own RetainUntil, or later if
// its tuple's lease was extended since it was dispatched.
func (s *Store) retainUntil(leases *bolt.Bucket, r *Receipt) time.Time {
	until := r.RetainUntil
	if end, ok := leaseEnd(leases, r.TupleSHA256); ok {
		until = laterOf(until, end.Add(s.opts.Retention))
	}
	return until
}

// pruneLeases deletes lease entries that no longer keep any key: past
// their end plus the retention, every key of the tuple is due anyway.
func (s *Store) pruneLeases(leases *bolt.Bucket, now time.Time) error {
	var expired [][]byte
	err := leases.ForEach(func(k, _ []byte) error {
		if end, ok := leaseEnd(leases, string(k)); ok && now.After(end.Add(s.opts.Retention)) {
			expired = append(expired, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range expired {
		if err := leases.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
