package opstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The op-key contract, written once and run against both backends: the
// bbolt Store (the tests named after each case, in store_test.go) and the
// EtcdStore against a real 3-member cluster (TestIntegrationEtcdContract).

// backend is an open store and how to reopen the same store as a crash
// or a handover would: the first holder goes away and a new one opens the
// same state.
type backend struct {
	keys   Keys
	reopen func(t *testing.T) Keys
}

// bboltBackend opens a Store in a fresh directory.
func bboltBackend(t *testing.T, o Options) backend {
	dir := t.TempDir()
	s := openT(t, dir, o)
	return backend{keys: s, reopen: func(t *testing.T) Keys {
		s.Close()
		return openT(t, dir, o)
	}}
}

func contractReplay(t *testing.T, b backend) {
	s := b.keys
	ctx := context.Background()
	tk, replay, err := s.Begin(ctx, intent("k1", "write a"))
	if err != nil || replay != nil || tk == nil {
		t.Fatalf("first Begin = %v, %v, %v; want a ticket", tk, replay, err)
	}
	finishOK(t, tk, `{"_meta":{"x":1}}`)
	before, err := s.Get(testKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, committed := range []bool{false, true} {
		if committed {
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		tk2, replay, err := s.Begin(ctx, intent("k1", "write a"))
		if err != nil || tk2 != nil || replay == nil {
			t.Fatalf("retry (committed=%v) = %v, %v, %v; want a replay", committed, tk2, replay, err)
		}
		again, _ := replay.Marshal()
		if !bytes.Equal(again, before) || string(replay.Response) != `{"_meta":{"x":1}}` {
			t.Fatalf("replayed receipt differs:\n%s\n%s", again, before)
		}
	}
	after, _ := s.Get(testKey("k1"))
	if !bytes.Equal(after, before) {
		t.Fatalf("stored receipt changed after commit:\n%s\n%s", after, before)
	}
}

func contractConflict(t *testing.T, b backend) {
	s := b.keys
	ctx := context.Background()
	tk, _, _ := s.Begin(ctx, intent("k1", "write a"))
	finishOK(t, tk, `{}`)
	_, _, err := s.Begin(ctx, intent("k1", "write b"))
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.InFlight || ce.Stored != digest("write a") {
		t.Fatalf("different digest: err = %v, want a stored-digest ConflictError", err)
	}
}

func contractConcurrentDuplicate(t *testing.T, b backend) {
	s := b.keys
	ctx := context.Background()
	const n = 16
	var wg sync.WaitGroup
	var tickets, conflicts atomic.Int32
	var won *Ticket
	var mu sync.Mutex
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, replay, err := s.Begin(ctx, intent("dup", "same"))
			switch {
			case tk != nil:
				tickets.Add(1)
				mu.Lock()
				won = tk
				mu.Unlock()
			case errors.Is(err, ErrConflict):
				var ce *ConflictError
				if errors.As(err, &ce) && ce.InFlight {
					conflicts.Add(1)
				}
			default:
				t.Errorf("unexpected Begin result %v %v", replay, err)
			}
		}()
	}
	wg.Wait()
	if tickets.Load() != 1 || conflicts.Load() != n-1 {
		t.Fatalf("tickets=%d in-flight conflicts=%d, want 1 and %d", tickets.Load(), conflicts.Load(), n-1)
	}
	finishOK(t, won, `{}`)
	if _, replay, err := s.Begin(ctx, intent("dup", "same")); replay == nil || err != nil {
		t.Fatalf("after finish: replay=%v err=%v", replay, err)
	}
}

func contractPendingCompletes(t *testing.T, b backend) {
	s := b.keys
	ctx := context.Background()
	tk, _, _ := s.Begin(ctx, intent("exec", "r"))
	if err := tk.Finish(&Receipt{Outcome: Pending, Response: json.RawMessage(`{"terminalId":"t1"}`), TerminalID: "t1"}); err != nil {
		t.Fatal(err)
	}
	code := 0
	err := s.Complete(ctx, testKey("exec"), func(r *Receipt) {
		r.Outcome, r.Exit = Verified, &ExitStatus{ExitCode: &code}
		r.Response = json.RawMessage(`{"terminalId":"forged"}`)
	})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := s.Get(testKey("exec"))
	r, _ := Unmarshal(data)
	if r.Outcome != Verified || string(r.Response) != `{"terminalId":"t1"}` {
		t.Fatalf("completed receipt = %s; want verified with the original response", data)
	}
	if err := s.Complete(ctx, testKey("exec"), func(r *Receipt) { r.Outcome = Failed }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("completing a final receipt: %v, want ErrInvalid", err)
	}
}

// contractIdempotent: a key claimed with BeginIdempotent answers a retry
// and a conflict exactly as Begin does.
func contractIdempotent(t *testing.T, b backend) {
	s := b.keys
	ctx := context.Background()
	tk, replay, err := s.BeginIdempotent(ctx, intent("rel", "release t1"))
	if err != nil || replay != nil || tk == nil {
		t.Fatalf("BeginIdempotent = %v, %v, %v; want a ticket", tk, replay, err)
	}
	if _, _, err := s.BeginIdempotent(ctx, intent("rel", "release t1")); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate in flight: %v, want ErrConflict", err)
	}
	if _, _, err := s.Begin(ctx, intent("rel", "release t1")); !errors.Is(err, ErrConflict) {
		t.Fatalf("durable Begin of a key claimed idempotently: %v, want ErrConflict", err)
	}
	finishOK(t, tk, `{}`)
	if _, replay, err := s.BeginIdempotent(ctx, intent("rel", "release t1")); err != nil || replay == nil || string(replay.Response) != `{}` {
		t.Fatalf("retry after finish = %v, %v; want the receipt replayed", replay, err)
	}
	if _, _, err := s.BeginIdempotent(ctx, intent("rel", "release t2")); !errors.Is(err, ErrConflict) {
		t.Fatalf("another digest: %v, want ErrConflict", err)
	}
}

// contractFateUnknownIsInterrupted: keys in flight (dispatched, and an
// exec whose exit was never observed) when their holder goes away are
// Interrupted for the next holder, never handed out again; a finished
// key keeps its receipt byte for byte; another digest still conflicts.
func contractFateUnknownIsInterrupted(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.keys
	if _, _, err := s.Begin(ctx, intent("inflight", "r")); err != nil {
		t.Fatal(err)
	}
	tk, _, _ := s.Begin(ctx, intent("exec", "r"))
	if err := tk.Finish(&Receipt{Outcome: Pending, Response: json.RawMessage(`{"terminalId":"t1"}`), TerminalID: "t1"}); err != nil {
		t.Fatal(err)
	}
	done, _, _ := s.Begin(ctx, intent("done", "r"))
	finishOK(t, done, `{"ok":1}`)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	doneBefore, _ := s.Get(testKey("done"))
	s = b.reopen(t)
	for _, k := range []string{"inflight", "exec"} {
		tk, r, err := s.Begin(ctx, intent(k, "r"))
		if tk != nil || err != nil || r == nil || r.Outcome != Interrupted {
			t.Fatalf("%s after its holder went away: ticket=%v receipt=%+v err=%v; want an interrupted replay", k, tk, r, err)
		}
		if _, _, err := s.Begin(ctx, intent(k, "other")); !errors.Is(err, ErrConflict) {
			t.Fatalf("%s with another digest: %v, want ErrConflict", k, err)
		}
	}
	if after, _ := s.Get(testKey("done")); !bytes.Equal(after, doneBefore) {
		t.Fatalf("finished receipt changed across the handover:\n%s\n%s", after, doneBefore)
	}
}

// contractKeepForLease: a key dispatched under a 1 h lease extended to
// 72 h is kept past dispatch + 25 h, across a reopen, until the extended
// lease plus the retention; another tuple's key is pruned.
func contractKeepForLease(t *testing.T, open func(t *testing.T, o Options) backend) {
	var now atomic.Pointer[time.Time]
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now.Store(&start)
	clock := func() time.Time { return *now.Load() }
	b := open(t, Options{Now: clock, WriteDelay: -1})
	s := b.keys
	ctx := context.Background()
	kept, other := intent("kept", "r"), intent("other", "r")
	kept.LeaseNotAfter, other.LeaseNotAfter = start.Add(time.Hour), start.Add(time.Hour)
	other.TupleSHA256 = digest("another tuple")
	for _, in := range []Intent{kept, other} {
		tk, _, err := s.Begin(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		finishOK(t, tk, `{}`)
	}
	if err := s.KeepForLease(ctx, kept.TupleSHA256, start.Add(72*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.KeepForLease(ctx, kept.TupleSHA256, start.Add(2*time.Hour)); err != nil { // earlier: no effect
		t.Fatal(err)
	}
	if err := s.KeepForLease(ctx, "not-a-digest", start); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad digest: %v, want ErrInvalid", err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) { t2 := start.Add(d); now.Store(&t2) }
	at(26 * time.Hour)
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(Key(other.TupleSHA256, other.SessionID, "other")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another tuple's expired key: %v, want pruned", err)
	}
	if _, err := s.Get(testKey("kept")); err != nil {
		t.Fatalf("key pruned inside the extended lease: %v", err)
	}
	s = b.reopen(t)
	at(72*time.Hour + 24*time.Hour) // exactly the end of retention: still kept
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(testKey("kept")); err != nil {
		t.Fatalf("key pruned at the extended lease + retention (after reopen): %v", err)
	}
	at(72*time.Hour + 24*time.Hour + time.Second)
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(testKey("kept")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("key past the extended lease + retention: %v, want pruned", err)
	}
}

// TestFateUnknownIsInterrupted runs the handover case on bbolt (close and
// reopen of the directory).
func TestFateUnknownIsInterrupted(t *testing.T) {
	contractFateUnknownIsInterrupted(t, bboltBackend(t, Options{}))
}
