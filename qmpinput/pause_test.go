package qmpinput

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestPauseFencesAndResumes: Pause sends exactly stop and fences agent
// input (captures still work); Resume sends cont and lifts the fence;
// both are audited without content; double pause and resume without a
// pause are refused; no audit, no pause.
func TestPauseFencesAndResumes(t *testing.T) {
	f := newFakeQMP(t)
	var mu sync.Mutex
	var audit []AuditEvent
	a := openFake(t, f, func(c *Config) {
		c.Audit = func(e AuditEvent) { mu.Lock(); audit = append(audit, e); mu.Unlock() }
	})
	ctx := ctx5(t)
	if err := a.Resume(ctx, "alice"); !errors.Is(err, ErrNotPaused) {
		t.Fatalf("resume before pause: %v", err)
	}
	if err := a.Pause(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := a.Pause(ctx, "bob"); !errors.Is(err, ErrPaused) {
		t.Fatalf("second pause: %v", err)
	}
	if actor, _, ok := a.Paused(); !ok || actor != "alice" {
		t.Fatalf("Paused() = %q %v", actor, ok)
	}
	before := len(f.commands())
	if err := a.Key(ctx, "a"); !errors.Is(err, ErrFenced) {
		t.Fatalf("agent key while paused: %v", err)
	}
	if len(f.commands()) != before {
		t.Fatal("fenced input reached QEMU")
	}
	if _, err := a.Capture(ctx); err != nil {
		t.Fatalf("capture while paused: %v", err)
	}
	if err := a.Resume(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := a.Key(ctx, "a"); err != nil {
		t.Fatalf("agent key after resume: %v", err)
	}
	var sent []string
	for _, c := range f.commands() {
		if c.Execute == "stop" || c.Execute == "cont" {
			sent = append(sent, c.Execute)
		}
	}
	if len(sent) != 2 || sent[0] != "stop" || sent[1] != "cont" {
		t.Fatalf("QEMU got %v, want stop then cont", sent)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(audit) != 2 || audit[0].Kind != "pause" || audit[1].Kind != "resume" || audit[1].Duration <= 0 || audit[0].Scope != "vm" {
		t.Fatalf("audit %+v", audit)
	}
	b := openFake(t, f, nil)
	if err := b.Pause(ctx, "x"); !errors.Is(err, ErrConfig) {
		t.Fatalf("pause without audit: %v", err)
	}
}

// TestHoldReleaseRunsBeforeUnfence: the release function of BeginWith
// runs once, with the reason, while the agent is still fenced.
func TestHoldReleaseRunsBeforeUnfence(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, func(c *Config) { c.Audit = func(AuditEvent) {} })
	ctx := ctx5(t)
	for _, c := range []struct {
		end  func(*Hold)
		ttl  time.Duration
		want EndReason
	}{
		{func(h *Hold) { h.EndWith(EndDisconnected) }, time.Minute, EndDisconnected},
		{func(h *Hold) {}, 30 * time.Millisecond, EndTTL},
		{func(h *Hold) { a.Handover().Revoke() }, time.Minute, EndRevoked},
	} {
		var calls []EndReason
		var fencedDuring error
		h, err := a.Handover().BeginWith(c.ttl, "alice", func(why EndReason) {
			calls = append(calls, why)
			fencedDuring = a.Key(context.Background(), "a")
		})
		if err != nil {
			t.Fatal(err)
		}
		c.end(h)
		<-h.Done()
		h.End()
		if len(calls) != 1 || calls[0] != c.want || !errors.Is(fencedDuring, ErrFenced) {
			t.Fatalf("release calls %v (want one %q), agent key during release: %v", calls, c.want, fencedDuring)
		}
		if err := a.Key(ctx, "a"); err != nil {
			t.Fatalf("after the hold: %v", err)
		}
	}
}

// TestAdoptPause: an adopted pause fences the agent without a stop, and
// Resume sends cont.
func TestAdoptPause(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, func(c *Config) { c.Audit = func(AuditEvent) {} })
	ctx := ctx5(t)
	if err := a.AdoptPause("alice (earlier view)", time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := a.Key(ctx, "a"); !errors.Is(err, ErrFenced) {
		t.Fatalf("agent key under an adopted pause: %v", err)
	}
	if err := a.AdoptPause("bob", time.Now()); !errors.Is(err, ErrPaused) {
		t.Fatalf("second adopt: %v", err)
	}
	if err := a.Resume(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, c := range f.commands() {
		if c.Execute == "stop" || c.Execute == "cont" {
			sent = append(sent, c.Execute)
		}
	}
	if len(sent) != 1 || sent[0] != "cont" {
		t.Fatalf("QEMU got %v, want only cont", sent)
	}
}
