package opstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Op keys are scoped per binding: the store keeps a receipt under
// Key(tuple digest, session id, op key), so a key one session used can be
// neither reserved nor replayed by another (its own use of the same op key
// is a different store key), and a session cannot squat the keys another
// is about to send. Receipts still carry the op key, the session and the
// tuple digest, which is what `tether-custodian receipts show` prints and
// matches --key against.

// Key returns the store key of opKey in the binding (tupleSHA256,
// sessionID): the hex SHA-256 of "TUPLE\nSESSION", "/", the op key. Op
// keys never contain "/", so the split is unambiguous.
func Key(tupleSHA256, sessionID, opKey string) string {
	sum := sha256.Sum256([]byte(tupleSHA256 + "\n" + sessionID))
	return hex.EncodeToString(sum[:]) + "/" + opKey
}

// opKeyOf returns the op key of store key k.
func opKeyOf(k string) string { return k[strings.LastIndexByte(k, '/')+1:] }

// key is the store key of the intent.
func (in *Intent) key() string { return Key(in.TupleSHA256, in.SessionID, in.OpKey) }

// key is the store key of the receipt.
func (r *Receipt) key() string { return Key(r.TupleSHA256, r.SessionID, r.OpKey) }

// scopeOldKeys moves receipts a store written before op keys were scoped
// kept under the bare op key to their scoped key (once, at Open, inside
// recovery's transaction), so their replays are still answered.
func scopeOldKeys(b *bolt.Bucket) error {
	var old [][]byte
	err := b.ForEach(func(k, _ []byte) error {
		if !bytes.Contains(k, []byte("/")) {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range old {
		r, err := Unmarshal(b.Get(k))
		if err != nil {
			return fmt.Errorf("scope op key %q: %w", k, err)
		}
		if err := putReceipt(b, r); err != nil {
			return err
		}
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
