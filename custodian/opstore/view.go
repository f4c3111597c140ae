package opstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ReadOnly returns every receipt in dir without modifying it, sorted by
// dispatch time, for inspection. Keys a stopped custodian dispatched
// without recording a result, which the next Open will mark interrupted,
// are shown as Interrupted already, and so are execs whose exit was never
// observed. While a custodian holds the directory it fails with ErrLocked;
// Snapshot also reads a running custodian's receipts.
func ReadOnly(dir string) ([]*Receipt, error) {
	if err := CheckPrivateDir(dir); err != nil {
		return nil, err
	}
	return readOnly(dir, lockTimeout)
}

// readOnly reads a store no process holds, waiting up to wait for its lock.
func readOnly(dir string, wait time.Duration) ([]*Receipt, error) {
	path := filepath.Join(dir, dbName)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no op key store in %s: %w", dir, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: wait})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is held by a running custodian; read it with opstore.Snapshot "+
			"(tether-custodian receipts show), or stop the custodian first", ErrLocked, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("open op key database: %w", err)
	}
	defer db.Close()
	byKey, err := readBucket(db)
	if err != nil {
		return nil, err
	}
	ids, err := listSegments(dir)
	if err != nil {
		return nil, err
	}
	intents, err := readSegments(dir, ids)
	if err != nil {
		return nil, err
	}
	now := nowUTC()
	for _, in := range intents {
		if r, ok := byKey[in.key()]; ok && r.DispatchedAt.Equal(in.DispatchedAt) && r.HasResult() {
			continue
		}
		byKey[in.key()] = interrupted(in, now, "custodian stopped before the result was recorded (not yet recovered)")
	}
	out := make([]*Receipt, 0, len(byKey))
	for _, r := range byKey {
		// Nobody holds the store, so nothing can finish these any more:
		// show them as the next Open will record them.
		switch r.Outcome {
		case Dispatched:
			r = interrupted(intentOf(r), now, "custodian stopped before the result was recorded (not yet recovered)")
		case Pending:
			interruptPending(r, now, "custodian stopped before the exit was observed (not yet recovered)")
		}
		out = append(out, r)
	}
	sortReceipts(out)
	return out, nil
}

func readBucket(db *bolt.DB) (map[string]*Receipt, error) {
	out := map[string]*Receipt{}
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(receiptsBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			r, err := Unmarshal(v)
			if err != nil {
				return err
			}
			out[r.key()] = r // a store written before keys were scoped holds bare op keys
			return nil
		})
	})
	return out, err
}
