package service

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
	bolt "go.etcd.io/bbolt"
)

// maxRecordBytes bounds one stored record (labels are bounded well below).
const maxRecordBytes = 64 << 10

var (
	bucketComputers = []byte("computers")
	bucketPool      = []byte("pool")
	bucketReceipts  = []byte("receipts")
)

// record is what the store holds for one computer. It is written before
// the side effect it describes, so after a crash it either tells the
// truth or names the intent (creating, expiring) the restart finishes.
type record struct {
	ID              string            `json:"id"`
	Owner           string            `json:"owner"`
	State           string            `json:"state"`
	Dir             string            `json:"dir,omitempty"`
	Limits          api.Limits        `json:"limits"`
	LeaseTTLSeconds int64             `json:"lease_ttl_s"`
	LeaseEnd        time.Time         `json:"lease_end,omitzero"`
	IdleTimeoutSecs int64             `json:"idle_timeout_s"`
	Labels          map[string]string `json:"labels,omitempty"`
	Created         time.Time         `json:"created"`
	FromPool        bool              `json:"from_pool,omitempty"`
	Reason          string            `json:"reason,omitempty"`
	Tuple           *admission.Tuple  `json:"tuple,omitempty"`
	CustodianConfig string            `json:"custodian_config,omitempty"`
	// Tier is the computer's tier; "" in records written before tiers
	// is api.TierNamespaced.
	Tier        string `json:"tier,omitempty"`
	Accelerator string `json:"accelerator,omitempty"`
	Transport   string `json:"transport,omitempty"`
	// Egress is the computer's egress policy (egress.go); absent denies
	// all.
	Egress policy.Policy `json:"egress,omitzero"`
	// Screen: the computer has a display and a live view (screen.go).
	Screen bool `json:"screen,omitempty"`
}

// store is the bbolt file: one bucket of computer records by id, one of
// warm-pool directories (a pool machine's intent: destroy it after a
// crash). Every write is one fsynced transaction.
type store struct{ db *bolt.DB }

// openStore opens or creates the store at path; the caller closes it.
func openStore(path string) (*store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("state store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketComputers, bucketPool, bucketReceipts} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("state store: buckets: %w", err)
	}
	return &store{db: db}, nil
}

func (s *store) put(r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("state store: encode %s: %w", r.ID, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketComputers).Put([]byte(r.ID), b) })
	if err != nil {
		return fmt.Errorf("state store: write %s: %w", r.ID, err)
	}
	return nil
}

// all returns every computer record, strictly decoded.
func (s *store) all() ([]record, error) {
	var out []record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketComputers).ForEach(func(k, v []byte) error {
			var r record
			if err := strictjson.Decode(v, maxRecordBytes, &r); err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			if r.ID != string(k) {
				return fmt.Errorf("record %q holds id %q", k, r.ID)
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state store: %w", err)
	}
	return out, nil
}

func (s *store) putPool(dir string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPool).Put([]byte(dir), []byte{1}) })
}

func (s *store) delPool(dir string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPool).Delete([]byte(dir)) })
}

func (s *store) poolDirs() ([]string, error) {
	var out []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPool).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// putReceipt appends r to the receipts bucket, keyed by a sequence
// number (8 bytes, big-endian), in one fsynced transaction.
func (s *store) putReceipt(r api.Receipt) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("state store: encode receipt: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketReceipts)
		seq, err := bk.NextSequence()
		if err != nil {
			return err
		}
		return bk.Put(binary.BigEndian.AppendUint64(nil, seq), b)
	})
	if err != nil {
		return fmt.Errorf("state store: write receipt: %w", err)
	}
	return nil
}

// receipts returns computer id's receipts, oldest first, strictly
// decoded.
func (s *store) receipts(id string) ([]api.Receipt, error) {
	var out []api.Receipt
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketReceipts).ForEach(func(k, v []byte) error {
			var r api.Receipt
			if err := strictjson.Decode(v, maxRecordBytes, &r); err != nil {
				return fmt.Errorf("receipt %x: %w", k, err)
			}
			if r.Computer == id {
				out = append(out, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state store: %w", err)
	}
	return out, nil
}

// exported reports whether a receipt of an export whose stream's
// SHA-256 is sha is in the receipts bucket.
func (s *store) exported(sha string) (bool, error) {
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketReceipts).ForEach(func(k, v []byte) error {
			var r api.Receipt
			if err := strictjson.Decode(v, maxRecordBytes, &r); err != nil {
				return fmt.Errorf("receipt %x: %w", k, err)
			}
			found = found || (r.Op == api.OpExport && r.SHA256 == sha)
			return nil
		})
	})
	if err != nil {
		return false, fmt.Errorf("state store: %w", err)
	}
	return found, nil
}

func (s *store) close() error { return s.db.Close() }
