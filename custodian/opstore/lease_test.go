package opstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestKeepForLeaseOutlivesTheExtendedLease dispatches a key under a 1 h
// lease, extends the tuple's lease to 72 h, and checks that neither the
// periodic retention (dispatch + 25 h) nor a reopen prunes the key until
// the extended lease plus the retention has passed. Another tuple's key
// is not kept by the extension.
func TestKeepForLeaseOutlivesTheExtendedLease(t *testing.T) {
	var now atomic.Pointer[time.Time]
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now.Store(&start)
	clock := func() time.Time { return *now.Load() }
	dir := t.TempDir()
	s := openT(t, dir, Options{Now: clock, WriteDelay: -1})
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
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{Now: clock, WriteDelay: -1})
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
