package opstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// testKey is the store key of an op key of intent()'s binding.
func testKey(opKey string) string { return Key(digest("tuple"), "sess-1", opKey) }

// TestAttackOpKeySquatAcrossSessions: the scoped-key contract on the bbolt
// store (TestIntegrationEtcdContract runs it on etcd).
func TestAttackOpKeySquatAcrossSessions(t *testing.T) {
	contractScopedKeys(t, bboltBackend(t, Options{}))
}

// contractScopedKeys: session B uses the op key session A is about to
// use, in flight and then answered; A's request with that key still runs
// (its own ticket), each session's retry is answered from its own receipt,
// and a conflict stays within a session.
func contractScopedKeys(t *testing.T, b backend) {
	s := b.keys
	if es, ok := s.(*EtcdStore); ok {
		claimT(t, es, "sess-B")
	}
	ctx := context.Background()
	squat := intent("victim-key", "B's request")
	squat.SessionID, squat.TupleSHA256 = "sess-B", digest("tuple of B")
	tb, _, err := s.Begin(ctx, squat)
	if err != nil {
		t.Fatal(err)
	}
	a := intent("victim-key", "A's request")
	ta, replay, err := s.Begin(ctx, a) // while B's is in flight
	if err != nil || ta == nil || replay != nil {
		t.Fatalf("A's key while B squats it in flight: ticket %v replay %v err %v; want A's own ticket", ta, replay, err)
	}
	finishOK(t, tb, `{"b":1}`)
	finishOK(t, ta, `{"a":1}`)
	if _, replay, err := s.Begin(ctx, squat); err != nil || replay == nil || string(replay.Response) != `{"b":1}` {
		t.Fatalf("B's replay: %+v %v", replay, err)
	}
	if _, replay, err := s.Begin(ctx, a); err != nil || replay == nil || string(replay.Response) != `{"a":1}` {
		t.Fatalf("A's replay answered %+v %v, want A's own receipt", replay, err)
	}
	other := a
	other.RequestSHA256 = digest("A's other request")
	if _, _, err := s.Begin(ctx, other); !errors.Is(err, ErrConflict) {
		t.Fatalf("A's key with another digest: %v, want a conflict in A's own scope", err)
	}
	rs, err := s.List()
	if err != nil || len(rs) != 2 {
		t.Fatalf("receipts %v %v, want one per binding", rs, err)
	}
}

// TestUnscopedKeysScopedAtOpen: a store written before op keys were
// scoped keeps receipts under the bare op key; Open moves them to their
// scoped key, so a retry is still answered from the receipt.
func TestUnscopedKeysScopedAtOpen(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{WriteDelay: -1})
	ctx := context.Background()
	in := intent("old-key", "r")
	tk, _, err := s.Begin(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	finishOK(t, tk, `{"old":1}`)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, dbName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { // as the earlier store kept it
		b := tx.Bucket(receiptsBucket)
		v := append([]byte(nil), b.Get([]byte(testKey("old-key")))...)
		if err := b.Delete([]byte(testKey("old-key"))); err != nil {
			return err
		}
		return b.Put([]byte("old-key"), v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ReadOnly(dir)
	if err != nil || len(rs) != 1 || rs[0].OpKey != "old-key" {
		t.Fatalf("ReadOnly of an unscoped store: %v %v", rs, err)
	}
	s = openT(t, dir, Options{})
	if _, replay, err := s.Begin(ctx, in); err != nil || replay == nil || string(replay.Response) != `{"old":1}` {
		t.Fatalf("retry after the upgrade: %+v %v", replay, err)
	}
}
