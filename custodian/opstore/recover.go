package opstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// recover runs at Open, before any request: every intent in the log and
// every key bbolt holds as Dispatched or Pending belonged to a process that
// is gone, so each one without a result becomes Interrupted. The result is
// committed (synced) before the segments are deleted. It returns the id for
// the new segment.
func (s *Store) recover() (uint64, error) {
	ids, err := listSegments(s.dir)
	if err != nil {
		return 0, err
	}
	intents, err := readSegments(s.dir, ids)
	if err != nil {
		return 0, err
	}
	now := s.opts.Now().UTC()
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(receiptsBucket)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(leasesBucket); err != nil {
			return err
		}
		if err := scopeOldKeys(b); err != nil {
			return err
		}
		if err := recoverIntents(b, intents, now); err != nil {
			return err
		}
		return recoverUnfinished(b, now)
	})
	if err != nil {
		return 0, fmt.Errorf("recover op keys: %w", err)
	}
	for _, id := range ids {
		if err := os.Remove(filepath.Join(s.dir, segName(id))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("remove recovered intent segment: %w", err)
		}
	}
	if err := syncDir(s.dir); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 1, nil
	}
	return ids[len(ids)-1] + 1, nil
}

// readSegments decodes every segment in order. Damage inside a segment is
// ErrCorrupt; only the last record of a segment may be torn.
func readSegments(dir string, ids []uint64) ([]Intent, error) {
	var all []Intent
	for _, id := range ids {
		data, err := os.ReadFile(filepath.Join(dir, segName(id)))
		if err != nil {
			return nil, fmt.Errorf("read intent segment: %w", err)
		}
		ins, _, err := ScanSegment(data)
		if err != nil {
			return nil, fmt.Errorf("segment %s: %w", segName(id), err)
		}
		all = append(all, ins...)
	}
	return all, nil
}

// recoverIntents writes an Interrupted receipt for every intent bbolt does
// not answer with a result of that same dispatch.
func recoverIntents(b *bolt.Bucket, intents []Intent, now time.Time) error {
	for i := range intents {
		in := &intents[i]
		if v := b.Get([]byte(in.key())); v != nil {
			r, err := Unmarshal(v)
			if err != nil {
				return err
			}
			if r.DispatchedAt.Equal(in.DispatchedAt) && r.HasResult() {
				continue
			}
		}
		if err := putReceipt(b, interrupted(*in, now, "custodian stopped before the result was recorded")); err != nil {
			return err
		}
	}
	return nil
}

// recoverUnfinished finalises keys bbolt holds as Dispatched (result never
// recorded) or Pending (exit never observed).
func recoverUnfinished(b *bolt.Bucket, now time.Time) error {
	var fix []*Receipt
	err := b.ForEach(func(k, v []byte) error {
		r, err := Unmarshal(v)
		if err != nil {
			return err
		}
		switch r.Outcome {
		case Dispatched:
			fix = append(fix, interrupted(intentOf(r), now, "custodian stopped before the result was recorded"))
		case Pending:
			interruptPending(r, now, "custodian stopped before the exit was observed")
			fix = append(fix, r)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range fix {
		if err := putReceipt(b, r); err != nil {
			return err
		}
	}
	return nil
}

func intentOf(r *Receipt) Intent {
	return Intent{OpKey: r.OpKey, RequestSHA256: r.RequestSHA256, Method: r.Method,
		SessionID: r.SessionID, TupleSHA256: r.TupleSHA256, Principal: r.Principal,
		LeaseNotAfter: r.LeaseNotAfter, DispatchedAt: r.DispatchedAt, RetainUntil: r.RetainUntil, TaggedBy: r.TaggedBy}
}

func putReceipt(b *bolt.Bucket, r *Receipt) error {
	data, err := r.Marshal()
	if err != nil {
		return err
	}
	return b.Put([]byte(r.key()), data)
}
