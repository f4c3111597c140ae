package view

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/token"
)

// TestPauseOwner: with Config.PauseOwner a control viewer's pause and
// resume are refused (forbidden) and the VM keeps running; the owner's
// Server.Pause stops it, tells the viewer (paused, by the owner) and is
// in the audit log; the viewer cannot resume it; the owner's Resume
// runs it again. Positive control: without PauseOwner the same viewer's
// pause stops the VM.
func TestPauseOwner(t *testing.T) {
	const owner, actor = "tether-computer", "tether-computer (suspend)"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Run("control: a viewer pauses without an owner", func(t *testing.T) {
		e := newEnv(t, nil)
		ws := controlViewer(t, ctx, e, "alice")
		op(ctx, ws, "pause")
		if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["paused"] == true }); err != nil {
			t.Fatal(err)
		}
		op(ctx, ws, "resume")
		if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" && m["paused"] == false }); err != nil {
			t.Fatal(err)
		}
	})
	e := newEnv(t, func(c *Config) { c.PauseOwner = owner })
	ws := controlViewer(t, ctx, e, "alice")
	if m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" }); err != nil || m["pause_owner"] != owner {
		t.Fatalf("state %v %v: want pause_owner %q", m, err, owner)
	}
	for _, name := range []string{"pause", "resume"} {
		op(ctx, ws, name)
		if m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "error" }); err != nil || m["code"] != "forbidden" {
			t.Fatalf("%s by a viewer of an owned VM: %v %v", name, m, err)
		}
	}
	if st, err := probeStatus(ctx, e.vm); err != nil || st != "running" {
		t.Fatalf("after the refused pause QEMU says %q (%v), want running", st, err)
	}
	if err := e.srv.Pause(ctx, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["paused"] == true && m["paused_by"] == actor }); err != nil {
		t.Fatalf("the viewer was not told of the owner's pause: %v", err)
	}
	if st, _ := probeStatus(ctx, e.vm); st != "paused" {
		t.Fatalf("after the owner's pause QEMU says %q", st)
	}
	op(ctx, ws, "resume")
	if m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "error" }); err != nil || m["code"] != "forbidden" {
		t.Fatalf("a viewer's resume of the owner's pause: %v %v", m, err)
	}
	if err := e.srv.Resume(ctx, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" && m["paused"] == false }); err != nil {
		t.Fatal(err)
	}
	if st, _ := probeStatus(ctx, e.vm); st != "running" {
		t.Fatalf("after the owner's resume QEMU says %q", st)
	}
	var kinds []string
	for _, r := range e.records(t) {
		if r.Kind == auditlog.KindPause || r.Kind == auditlog.KindResume {
			if r.Actor != actor {
				t.Fatalf("%s recorded for %q, want the owner", r.Kind, r.Actor)
			}
			kinds = append(kinds, r.Kind)
		}
	}
	if len(kinds) != 2 || kinds[0] != auditlog.KindPause || kinds[1] != auditlog.KindResume {
		t.Fatalf("audit pause/resume records %v, want the owner's pause then resume", kinds)
	}
}

// TestAttendedAt: watchers do not attend a VM, a take-over does while it
// lasts, and its end is when the person last attended it. A view-only
// viewer and a control viewer that has not taken over leave AttendedAt
// zero (the control: nobody holds input); during a take-over it reads
// the clock's now, later each time; after the hand back it stays at the
// moment the hold ended.
func TestAttendedAt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t, nil)
	_, secret := e.mint(t, token.RoleView, time.Hour, "watcher")
	c := e.client(e.origin)
	if st, _ := c.exchange(secret); st != http.StatusOK {
		t.Fatalf("exchange of the view link: %d", st)
	}
	watcher, _, err := c.control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.CloseNow()
	ws := controlViewer(t, ctx, e, "alice")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" }); err != nil {
		t.Fatal(err)
	}
	if at := e.srv.AttendedAt(); !at.IsZero() {
		t.Fatalf("watchers only: attended at %v, want zero", at)
	}
	before := time.Now()
	takeOver(t, ctx, ws)
	first := e.srv.AttendedAt()
	waitFor(t, ctx, "AttendedAt to move on during the hold", func() bool { return e.srv.AttendedAt().After(first) })
	if first.Before(before) {
		t.Fatalf("during the hold attended at %v, before the take-over at %v", first, before)
	}
	handedBack := time.Now()
	op(ctx, ws, "handback")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" && m["holder"] == "" }); err != nil {
		t.Fatal(err)
	}
	ended := e.srv.AttendedAt()
	if ended.Before(handedBack) || ended.After(time.Now()) {
		t.Fatalf("after the hand back attended at %v, want between %v and now", ended, handedBack)
	}
	// Once the clock has passed the end, a reading of it would differ.
	waitFor(t, ctx, "the clock to pass the hold's end", func() bool { return time.Now().After(ended) })
	if again := e.srv.AttendedAt(); !again.Equal(ended) {
		t.Fatalf("AttendedAt moved from %v to %v with nobody holding input", ended, again)
	}
}
