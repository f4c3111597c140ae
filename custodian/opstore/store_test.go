package opstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func digest(s string) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 64)
	for i := range b {
		b[i] = hex[(int(s[i%len(s)])+i)%16]
	}
	return string(b)
}

func intent(key, req string) Intent {
	return Intent{OpKey: key, RequestSHA256: digest(req), Method: "fs/write_text_file",
		SessionID: "sess-1", TupleSHA256: digest("tuple"), Principal: "alice",
		LeaseNotAfter: time.Now().Add(time.Hour)}
}

func openT(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func finishOK(t *testing.T, tk *Ticket, resp string) {
	t.Helper()
	if err := tk.Finish(&Receipt{Outcome: Verified, Response: json.RawMessage(resp)}); err != nil {
		t.Fatalf("Finish: %v", err)
	}
}

func TestSameKeySameDigestReplaysByteForByte(t *testing.T) {
	contractReplay(t, bboltBackend(t, Options{}))
}

func TestDifferentDigestConflicts(t *testing.T) {
	contractConflict(t, bboltBackend(t, Options{}))
}

func TestConcurrentDuplicateConflicts(t *testing.T) {
	contractConcurrentDuplicate(t, bboltBackend(t, Options{}))
}

func TestOneFdatasyncPerDispatchAndGroupCommit(t *testing.T) {
	var syncs atomic.Int32
	orig := fdatasync
	fdatasync = func(fd int) error { syncs.Add(1); return orig(fd) }
	t.Cleanup(func() { fdatasync = orig })
	s := openT(t, t.TempDir(), Options{})
	ctx := context.Background()
	tk, _, err := s.Begin(ctx, intent("one", "r"))
	if err != nil {
		t.Fatal(err)
	}
	if got := syncs.Load(); got != 1 {
		t.Fatalf("Begin spent %d fdatasyncs, want exactly 1", got)
	}
	finishOK(t, tk, `{}`)
	if got := syncs.Load(); got != 1 {
		t.Fatalf("Finish spent a durable write on the request path (%d fdatasyncs)", got)
	}
	syncs.Store(0)
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, _, err := s.Begin(ctx, intent(fmt.Sprintf("g%d", i), "r"))
			if err != nil {
				t.Error(err)
				return
			}
			finishOK(t, tk, `{}`)
		}()
	}
	wg.Wait()
	if got := syncs.Load(); got < 1 || got > n {
		t.Fatalf("%d concurrent Begins made %d fdatasyncs, want 1..%d", n, got, n)
	}
	t.Logf("%d concurrent dispatches shared %d fdatasyncs", n, syncs.Load())
}

func TestBrokenSyncRefusesFurtherDispatch(t *testing.T) {
	orig := fdatasync
	fdatasync = func(int) error { return errors.New("EIO") }
	t.Cleanup(func() { fdatasync = orig })
	s := openT(t, t.TempDir(), Options{})
	ctx := context.Background()
	if tk, _, err := s.Begin(ctx, intent("a", "r")); tk != nil || !errors.Is(err, ErrBroken) {
		t.Fatalf("Begin with failing fdatasync = %v, %v; want ErrBroken", tk, err)
	}
	fdatasync = orig
	if tk, _, err := s.Begin(ctx, intent("b", "r")); tk != nil || !errors.Is(err, ErrBroken) {
		t.Fatalf("Begin after a failed fdatasync = %v, %v; want ErrBroken (no retry of a failed sync)", tk, err)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

func TestRetentionFloorAndPrune(t *testing.T) {
	if _, err := Open(t.TempDir(), Options{Retention: time.Hour}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("retention 1h: %v, want ErrInvalid", err)
	}
	var now atomic.Pointer[time.Time]
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now.Store(&start)
	clock := func() time.Time { return *now.Load() }
	s := openT(t, t.TempDir(), Options{Now: clock, PruneEvery: 10 * time.Millisecond})
	ctx := context.Background()
	in := intent("old", "r")
	in.LeaseNotAfter = start.Add(48 * time.Hour)
	tk, _, _ := s.Begin(ctx, in)
	finishOK(t, tk, `{}`)
	if got := tk.Intent().RetainUntil; !got.Equal(start.Add(72 * time.Hour)) {
		t.Fatalf("RetainUntil = %v, want lease end + 24h = %v", got, start.Add(72*time.Hour))
	}
	s.Flush(ctx)
	mid := start.Add(71 * time.Hour) // past 24 h, still within lease + 24 h
	now.Store(&mid)
	time.Sleep(50 * time.Millisecond)
	if _, err := s.Get(testKey("old")); err != nil {
		t.Fatalf("receipt pruned before lease end + retention: %v", err)
	}
	late := start.Add(73 * time.Hour)
	now.Store(&late)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := s.Get(testKey("old")); errors.Is(err, ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("expired receipt never pruned")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPendingCompletes(t *testing.T) {
	contractPendingCompletes(t, bboltBackend(t, Options{}))
}

func TestPrivateDirRefused(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := Open(open, Options{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("world-writable state dir: %v, want ErrInvalid", err)
	}
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o700)
	link := filepath.Join(base, "link")
	os.Symlink(real, link)
	if _, err := Open(link, Options{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("symlinked state dir: %v, want ErrInvalid", err)
	}
}

// TestTaggedByKeptInReceipts: a key the custodian minted for a plain agent
// says so in its receipt, finished or found interrupted after a restart.
func TestTaggedByKeptInReceipts(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := intent("plain-1", "write a")
	in.TaggedBy = "custodian"
	tk, _, err := s.Begin(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	finishOK(t, tk, `{}`)
	lost := intent("plain-2", "write b")
	lost.TaggedBy = "custodian"
	if _, _, err := s.Begin(ctx, lost); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{})
	for key, outcome := range map[string]Outcome{"plain-1": Verified, "plain-2": Interrupted} {
		raw, err := s.Get(testKey(key))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Unmarshal(raw)
		if err != nil || r.TaggedBy != "custodian" || r.Outcome != outcome {
			t.Fatalf("%s: receipt %+v, %v; want tagged_by custodian, %s", key, r, err, outcome)
		}
	}
}
