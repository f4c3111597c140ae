package opstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGroupCommitSharesOneSync shows that concurrent dispatches share the
// intent log's fdatasync: the first sync is held until all n intents are
// written (the in-flight window a slow disk opens), and then n Begins have
// cost exactly two fdatasyncs (the first leader's, covering its own
// intent, and one covering the n-1 written while it ran), where one sync
// per dispatch would be n. Each Begin still returns only after the sync
// that covers its own intent: none returns before the gate opens, except
// the ones the first sync covers.
func TestGroupCommitSharesOneSync(t *testing.T) {
	const n = 64
	s := openT(t, t.TempDir(), Options{})
	var syncs atomic.Int32
	gate := make(chan struct{})
	orig := fdatasync
	fdatasync = func(fd int) error {
		if syncs.Add(1) == 1 {
			<-gate
		}
		return orig(fd)
	}
	t.Cleanup(func() { fdatasync = orig })
	ctx := context.Background()
	var returned atomic.Int32
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
			returned.Add(1)
			finishOK(t, tk, `{}`)
		}()
	}
	waitWritten(t, s.log, n)
	if got := returned.Load(); got != 0 {
		t.Fatalf("%d Begins returned while the sync covering their intents was held", got)
	}
	close(gate)
	wg.Wait()
	if got := syncs.Load(); got != 2 {
		t.Fatalf("%d concurrent Begins made %d fdatasyncs, want 2 (one shared by the %d in flight)", n, got, n-1)
	}
	t.Logf("%d concurrent dispatches: %d fdatasyncs", n, syncs.Load())
}

// waitWritten waits until the log holds n appended intents.
func waitWritten(t *testing.T, l *intentLog, n uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.mu.Lock()
		w := l.written
		l.mu.Unlock()
		if w >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d intents written", w, n)
		}
		time.Sleep(time.Millisecond) // polls the condition; the deadline bounds a slow machine
	}
}
