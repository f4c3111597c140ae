package view

import (
	"context"
	"testing"
	"time"

	"github.com/tetherdev/tether/qmpinput/auditlog"
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
