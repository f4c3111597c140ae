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

// contractScopedKeys: a squatter uses the op key session A is about to
// use, in flight and then answered; A's request with that key still runs
// (its own ticket), each binding's retry is answered from its own receipt,
// and a conflict stays within a binding. The squatter differs from A in
// one part of the binding only, so each part is shown to scope the key on
// its own: another session of the very same tuple (two ACP sessions may
// bind one tuple), then the same session id on another tuple.
func contractScopedKeys(t *testing.T, b backend) {
	for _, c := range []struct {
		name  string
		squat Intent
	}{
		{"same tuple, other session", scopedSquat("sess-B", digest("tuple"))},
		{"other tuple, same session", scopedSquat("sess-1", digest("tuple of B"))},
	} {
		t.Run(c.name, func(t *testing.T) { contractScopedKey(t, b.keys, c.squat) })
	}
}

// scopedSquat is the squatter's intent in the binding (tupleSHA256,
// sessionID). Its op key names the case, so the cases do not meet in one
// store.
func scopedSquat(sessionID, tupleSHA256 string) Intent {
	in := intent("victim-"+sessionID+"-"+tupleSHA256[:8], "B's request")
	in.SessionID, in.TupleSHA256 = sessionID, tupleSHA256
	return in
}

// contractScopedKey runs the contract of contractScopedKeys with one
// squatter.
func contractScopedKey(t *testing.T, s Keys, squat Intent) {
	if es, ok := s.(*EtcdStore); ok && squat.SessionID != "sess-1" {
		claimT(t, es, squat.SessionID)
	}
	ctx := context.Background()
	tb, _, err := s.Begin(ctx, squat)
	if err != nil {
		t.Fatal(err)
	}
	a := intent(squat.OpKey, "A's request")
	ta, replay, err := s.Begin(ctx, a) // while the squatter's is in flight
	if err != nil || ta == nil || replay != nil {
		t.Fatalf("A's key while it is squatted in flight: ticket %v replay %v err %v; want A's own ticket", ta, replay, err)
	}
	finishOK(t, tb, `{"b":1}`)
	finishOK(t, ta, `{"a":1}`)
	if _, replay, err := s.Begin(ctx, squat); err != nil || replay == nil || string(replay.Response) != `{"b":1}` {
		t.Fatalf("the squatter's replay: %+v %v", replay, err)
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
	if err != nil {
		t.Fatal(err)
	}
	if n := countOpKey(rs, squat.OpKey); n != 2 {
		t.Fatalf("%d receipts of op key %s, want one per binding", n, squat.OpKey)
	}
}

// countOpKey counts the receipts of opKey.
func countOpKey(rs []*Receipt, opKey string) int {
	n := 0
	for _, r := range rs {
		if r.OpKey == opKey {
			n++
		}
	}
	return n
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
