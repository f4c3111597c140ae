package signedfile

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
)

// TestHammerReaderVersusPublisher publishes 1,000 generations while readers
// load the file (a Loader, as the receiver does on every change) and look
// grants up (a Refresher without fsnotify, as on a 9p share). Every
// generation's grant names its own generation, so a torn or mixed snapshot
// would show. No reader may ever see an error or a lower generation.
func TestHammerReaderVersusPublisher(t *testing.T) {
	const generations = 1000
	dir, k := adminDir(t), testKey(t)
	na := t0.Add(time.Hour)
	pub := newTestPublisher(t, dir, k, clockAt(t0))
	publish := func(gen uint64) {
		tu := exampleTuple()
		tu.Session = fmt.Sprintf("g%d", gen)
		mustPublish(t, pub, inputWith(gen, na, grantFor(exampleTuple(), na), grantFor(tu, na, admission.OpRead)))
	}
	publish(1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	seen := make([]map[uint64]bool, 2)
	var latest [2]atomic.Uint64 // the last generation each reader saw
	wg.Add(2)
	go func() {
		defer wg.Done()
		seen[0] = hammerLoader(ctx, t, newTestLoader(t, dir, k.Public(), clockAt(t0)), &latest[0])
	}()
	go func() {
		defer wg.Done()
		seen[1] = hammerRefresher(ctx, t, dir, k, &latest[1])
	}()
	for gen := uint64(2); gen <= generations; gen++ {
		publish(gen)
	}
	// Let each reader reach the last generation: an event, not a sleep
	// (bounded for a loaded machine; a reader that stopped on an error
	// has reported it).
	deadline := time.Now().Add(30 * time.Second)
	for (latest[0].Load() != generations || latest[1].Load() != generations) && time.Now().Before(deadline) && !t.Failed() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	for i, name := range []string{"loader", "refresher"} {
		if len(seen[i]) < 10 || !seen[i][generations] {
			t.Errorf("%s observed %d distinct generations (last seen: %v); the readers did not interleave with the writer",
				name, len(seen[i]), seen[i][generations])
		}
	}
}

// hammerLoader loads until ctx ends and returns the generations it saw.
func hammerLoader(ctx context.Context, t *testing.T, l *Loader, latest *atomic.Uint64) map[uint64]bool {
	seen := map[uint64]bool{}
	var last uint64
	for ctx.Err() == nil {
		ld, err := l.Load(context.Background())
		if err != nil {
			t.Errorf("loader: %v (after generation %d)", err, last)
			return seen
		}
		s := ld.Snapshot
		if s.Generation < last || len(s.Grants) != 2 || s.Grants[1].Tuple.Session != fmt.Sprintf("g%d", s.Generation) {
			t.Errorf("loader: generation %d after %d, grants %+v", s.Generation, last, s.Grants)
			return seen
		}
		last = s.Generation
		seen[last] = true
		latest.Store(last)
	}
	return seen
}

// hammerRefresher alternates Lookup and Current; each must be
// self-consistent and never go back.
func hammerRefresher(ctx context.Context, t *testing.T, dir string, k signing.PrivateKey, latest *atomic.Uint64) map[uint64]bool {
	r, err := NewRefresher(context.Background(), newTestLoader(t, dir, k.Public(), clockAt(t0)), RefresherOptions{NoWatch: true})
	if err != nil {
		t.Error(err)
		return nil
	}
	defer r.Close()
	seen := map[uint64]bool{}
	var last uint64
	sha := exampleTuple().SHA256()
	for ctx.Err() == nil {
		_, gen, err := r.Lookup(context.Background(), sha, admission.OpExec)
		if err != nil || gen < last {
			t.Errorf("refresher Lookup: generation %d after %d: %v", gen, last, err)
			return seen
		}
		s, err := r.Current(context.Background())
		if err != nil || s.Generation < gen || len(s.Grants) != 2 || s.Grants[1].Tuple.Session != fmt.Sprintf("g%d", s.Generation) {
			t.Errorf("refresher Current: generation %d after %d, grants %+v: %v", s.Generation, gen, s.Grants, err)
			return seen
		}
		last = s.Generation
		seen[gen], seen[last] = true, true
		latest.Store(last)
	}
	return seen
}
