package opstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// TestBeginIdempotentSpendsNoDurableWrite: an idempotent claim answers a
// retry and a conflict exactly as Begin does, without an fdatasync or an
// intent record before the dispatch.
func TestBeginIdempotentSpendsNoDurableWrite(t *testing.T) {
	var syncs atomic.Int32
	orig := fdatasync
	fdatasync = func(fd int) error { syncs.Add(1); return orig(fd) }
	t.Cleanup(func() { fdatasync = orig })
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	tk, replay, err := s.BeginIdempotent(ctx, intent("rel", "release t1"))
	if err != nil || replay != nil || tk == nil {
		t.Fatalf("BeginIdempotent = %v, %v, %v; want a ticket", tk, replay, err)
	}
	if n := syncs.Load(); n != 0 {
		t.Fatalf("an idempotent claim spent %d fdatasyncs before dispatch, want 0", n)
	}
	s.log.mu.Lock()
	appended := s.log.cur.appended
	s.log.mu.Unlock()
	if appended != 0 {
		t.Fatalf("an idempotent claim appended %d intents to the log, want 0", appended)
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
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, replay, err := s.Begin(ctx, intent("rel", "release t1")); err != nil || replay == nil {
		t.Fatalf("retry after commit = %v, %v; want the receipt replayed from bbolt", replay, err)
	}
}

// TestBeginIdempotentInFlightAtCloseBecomesInterrupted: a claim whose
// Dispatched receipt reached bbolt and whose result never did reads
// interrupted after the next Open.
func TestBeginIdempotentInFlightAtCloseBecomesInterrupted(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	if _, _, err := s.BeginIdempotent(ctx, intent("rel", "release t1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{})
	_, r, err := s.BeginIdempotent(ctx, intent("rel", "release t1"))
	if err != nil || r == nil || r.Outcome != Interrupted {
		t.Fatalf("after reopen = %+v, %v; want interrupted", r, err)
	}
}
