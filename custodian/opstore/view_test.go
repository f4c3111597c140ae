package opstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestReadOnlyShowsReceiptsAndRefusesWhileLocked(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	tk, _, _ := s.Begin(ctx, intent("a", "1"))
	finishOK(t, tk, `{"x":1}`)
	if _, err := ReadOnly(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("ReadOnly while open: %v, want ErrLocked", err)
	}
	s.Close()
	rs, err := ReadOnly(dir)
	if err != nil || len(rs) != 1 || rs[0].OpKey != "a" || rs[0].Outcome != Verified {
		t.Fatalf("ReadOnly = %+v, %v", rs, err)
	}
}

func TestReadOnlyShowsUnrecoveredIntentsAsInterrupted(t *testing.T) {
	dir := t.TempDir()
	killAt(t, dir, "begun")
	rs, err := ReadOnly(dir)
	if err != nil || len(rs) != 1 || rs[0].Outcome != Interrupted {
		t.Fatalf("ReadOnly after crash = %+v, %v; want the key interrupted", rs, err)
	}
	ids, _ := listSegments(dir)
	if len(ids) == 0 {
		t.Fatal("ReadOnly recovered (deleted segments); it must not modify the store")
	}
}

// TestSnapshotOfARunningStore: while a store is open (its lock held),
// Snapshot from another handle gets every receipt through the holder: the
// final ones, the key in flight as dispatched, the running exec as
// pending; and the exchange leaves no file behind.
func TestSnapshotOfARunningStore(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{WriteDelay: 20 * time.Millisecond, SnapshotPoll: 10 * time.Millisecond})
	ctx := context.Background()
	seedLive(t, s)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rs, err := Snapshot(sctx, dir)
	if err != nil {
		t.Fatalf("Snapshot of a running store: %v", err)
	}
	wantLive(t, rs)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), snapPrefix) {
			t.Fatalf("%s left in the store directory", e.Name())
		}
	}
	if tk, _, err := s.Begin(ctx, intent("after", "4")); err != nil || tk == nil {
		t.Fatalf("the store after a snapshot: %v", err)
	}
}

// TestSnapshotOverlaysQueuedResults: a snapshot served while results wait
// for bbolt shows them (bbolt overlaid with the queue), not bbolt's older
// state.
func TestSnapshotOverlaysQueuedResults(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{WriteDelay: -1})
	ctx := context.Background()
	done, _, _ := s.Begin(ctx, intent("done", "1"))
	finishOK(t, done, `{"x":1}`)
	s.Close()
	s = openT(t, dir, Options{WriteDelay: 2 * time.Second, SnapshotPoll: time.Hour})
	seedLive(t, s) // queued behind a 2 s write delay
	const id = "0123456789abcdef0123456789abcdef"
	s.mu.Lock()
	s.snapWant = []string{id}
	s.mu.Unlock()
	s.serveSnapshots()
	data, err := os.ReadFile(filepath.Join(dir, snapPrefix+id+snapReadyExt))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	wantLive(t, rs)
}

// seedLive leaves "done" final, "flying" in flight and "exec" pending.
func seedLive(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	if done, _, _ := s.Begin(ctx, intent("done", "1")); done != nil {
		finishOK(t, done, `{"x":1}`)
	}
	if _, _, err := s.Begin(ctx, intent("flying", "2")); err != nil {
		t.Fatal(err)
	}
	exec, _, _ := s.Begin(ctx, intent("exec", "3"))
	if err := exec.Finish(&Receipt{Outcome: Pending, Response: json.RawMessage(`{"terminalId":"t1"}`), TerminalID: "t1"}); err != nil {
		t.Fatal(err)
	}
}

func wantLive(t *testing.T, rs []*Receipt) {
	t.Helper()
	got := map[string]Outcome{}
	for _, r := range rs {
		got[r.OpKey] = r.Outcome
	}
	want := map[string]Outcome{"done": Verified, "flying": Dispatched, "exec": Pending}
	if len(got) != len(want) || got["done"] != want["done"] || got["flying"] != want["flying"] || got["exec"] != want["exec"] {
		t.Fatalf("snapshot outcomes %v, want %v", got, want)
	}
}

// TestSnapshotOfAStoppedStore reads the database directly, like ReadOnly.
func TestSnapshotOfAStoppedStore(t *testing.T) {
	dir := t.TempDir()
	killAt(t, dir, "begun")
	rs, err := Snapshot(context.Background(), dir)
	if err != nil || len(rs) != 1 || rs[0].Outcome != Interrupted {
		t.Fatalf("Snapshot after a crash = %+v, %v; want the key interrupted", rs, err)
	}
}

// TestSnapshotHolderThatDoesNotAnswer: a process holds the database lock
// but serves no snapshots (an older custodian); Snapshot gives up when its
// context ends with ErrLocked saying what to do, and removes its request.
func TestSnapshotHolderThatDoesNotAnswer(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	s.Close()
	db, err := bolt.Open(filepath.Join(dir, dbName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = Snapshot(ctx, dir)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "stop it and run this again") {
		t.Fatalf("unanswered snapshot: %v, want ErrLocked saying what to do", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), snapPrefix) {
			t.Fatalf("%s left behind", e.Name())
		}
	}
}

// TestSnapshotRequestsAreValidated: only well-formed request names are
// claimed; anything else in the directory is left alone.
func TestSnapshotRequestsAreValidated(t *testing.T) {
	dir := t.TempDir()
	good := snapPrefix + strings.Repeat("a", 32) + snapRequestExt
	for _, n := range []string{good, snapPrefix + "../x" + snapRequestExt, snapPrefix + strings.Repeat("A", 32) + snapRequestExt,
		snapPrefix + "short" + snapRequestExt, "intent-x.log"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	ids := claimSnapshotRequests(dir)
	if len(ids) != 1 || ids[0] != strings.Repeat("a", 32) {
		t.Fatalf("claimed %v, want only the well-formed request", ids)
	}
	if _, err := os.Stat(filepath.Join(dir, good)); !os.IsNotExist(err) {
		t.Fatal("a claimed request is still there (it would be served twice)")
	}
}

// FuzzDecodeSnapshot: a snapshot file either decodes into receipts whose
// outcomes are in the closed set, each re-encoding to a line of the input,
// or is refused; it never panics.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add([]byte(`{"op_key":"a","request_sha256":"` + strings.Repeat("a", 64) + `","method":"m","session_id":"s","tuple_sha256":"t","principal":"p","lease_not_after":"2026-01-01T00:00:00Z","dispatched_at":"2026-01-01T00:00:00Z","retain_until":"2026-01-02T00:00:00Z","outcome":"dispatched"}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"outcome":"verified"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		if n := bytes.Count(data, []byte("\n")); n != len(rs) {
			t.Fatalf("%d lines decoded into %d receipts", n, len(rs))
		}
		for _, r := range rs {
			if !r.Outcome.Valid() {
				t.Fatalf("outcome %q outside the closed set", r.Outcome)
			}
		}
	})
}
