package view

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/token"
)

// controlViewer exchanges a fresh control token and opens its control
// socket.
func controlViewer(t *testing.T, ctx context.Context, e *env, label string) *websocket.Conn {
	t.Helper()
	_, s := e.mint(t, token.RoleControl, time.Hour, label)
	c := e.client(e.origin)
	if st, _ := c.exchange(s); st != http.StatusOK {
		t.Fatal(st)
	}
	ws, _, err := c.control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func takeOver(t *testing.T, ctx context.Context, ws *websocket.Conn) {
	t.Helper()
	op(ctx, ws, "takeover")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["holder_is_you"] == true }); err != nil {
		t.Fatal(err)
	}
}

func lastEnd(t *testing.T, e *env) string {
	t.Helper()
	end := ""
	for _, r := range e.records(t) {
		if r.Kind == "handover_end" {
			end = r.Reason
		}
	}
	return end
}

// TestHoldEndsByTTLAndByClose: a hold ends by its TTL and when the
// holder's WebSocket closes; either way the agent is unfenced and the
// audit log names the reason. A second person cannot take over a held
// VM.
func TestHoldEndsByTTLAndByClose(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxHold = 1500 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice, bob := controlViewer(t, ctx, e, "alice"), controlViewer(t, ctx, e, "bob")
	takeOver(t, ctx, alice)
	op(ctx, bob, "takeover")
	if m, err := readUntil(ctx, bob, func(m map[string]any) bool { return m["type"] == "error" }); err != nil || m["code"] != "held" {
		t.Fatalf("a second takeover: %v %v", m, err)
	}
	if _, err := readUntil(ctx, alice, func(m map[string]any) bool { return m["type"] == "state" && m["holder"] == "" }); err != nil {
		t.Fatalf("the hold did not end by its TTL: %v", err)
	}
	if end := lastEnd(t, e); end != string(qmpinput.EndTTL) {
		t.Fatalf("ended as %q, want ttl", end)
	}
	if err := e.adapter.Key(ctx, "z"); err != nil {
		t.Fatalf("agent after the TTL: %v", err)
	}
	takeOver(t, ctx, bob)
	if err := e.adapter.Key(ctx, "z"); !errors.Is(err, qmpinput.ErrFenced) {
		t.Fatalf("agent during bob's hold: %v", err)
	}
	bob.Close(websocket.StatusNormalClosure, "tab closed")
	waitFor(t, ctx, "the agent to be unfenced", func() bool { return e.adapter.Key(ctx, "z") == nil })
	if end := lastEnd(t, e); end != string(qmpinput.EndDisconnected) {
		t.Fatalf("ended as %q, want disconnected", end)
	}
	checkViewerRecords(t, ctx, e)
}

// checkViewerRecords: each viewer's opening is in the log with its actor,
// role and token, and bob's closed tab is too, after his hold's end.
func checkViewerRecords(t *testing.T, ctx context.Context, e *env) {
	t.Helper()
	var opened []string
	closed := -1
	waitFor(t, ctx, "bob's viewer_close", func() bool {
		opened, closed = nil, -1
		for i, r := range e.records(t) {
			switch r.Kind {
			case "viewer_open":
				opened = append(opened, r.Actor+":"+r.Role)
				if r.Token == "" || !strings.HasPrefix(r.Scope, "viewer ") {
					t.Fatalf("viewer_open %+v lacks its token or viewer", r)
				}
			case "viewer_close":
				if strings.Contains(r.Actor, "bob") {
					closed = i
				}
			}
		}
		return closed >= 0
	})
	if len(opened) != 2 || !strings.Contains(opened[0], "alice") || !strings.Contains(opened[1], "bob") ||
		!strings.HasSuffix(opened[0], ":control") {
		t.Fatalf("viewer_open records %v, want alice's and bob's control viewers", opened)
	}
}

// TestHoldNeverOutlivesItsToken: a takeover with a token that expires
// before MaxHold gets a hold that ends with the token.
func TestHoldNeverOutlivesItsToken(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, s := e.mint(t, token.RoleControl, 2*time.Second, "short")
	c := e.client(e.origin)
	c.exchange(s)
	ws, _, err := c.control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	op(ctx, ws, "takeover")
	m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["holder_is_you"] == true })
	if err != nil {
		t.Fatal(err)
	}
	exp, _ := time.Parse(time.RFC3339Nano, m["expires"].(string))
	if d := time.Until(exp); d > 2*time.Second {
		t.Fatalf("hold expires in %v, beyond its 2 s token", d)
	}
}

// TestUnrecordedTakeoverIsUndone: when the begin record cannot be
// written (the log ends in a damaged line, so no append may extend it),
// the take over is undone and the agent is not left fenced; the same for
// a pause.
func TestUnrecordedTakeoverIsUndone(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws := controlViewer(t, ctx, e, "frank")
	f, err := os.OpenFile(filepath.Join(e.state, "audit.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte(`{"seq":1,"partial`))
	f.Close()
	for _, name := range []string{"takeover", "pause"} {
		op(ctx, ws, name)
		if m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "error" }); err != nil || m["code"] != "audit" {
			t.Fatalf("%s with a broken log: %v %v", name, m, err)
		}
	}
	if err := e.adapter.Key(ctx, "z"); err != nil {
		t.Fatalf("the agent is fenced after an unrecorded take over: %v", err)
	}
	if _, _, paused := e.adapter.Paused(); paused {
		t.Fatal("the VM stayed paused after an unrecorded pause")
	}
	if st, _ := probeStatus(ctx, e.vm); st != "running" {
		t.Fatalf("QEMU reports %q after the pause was undone", st)
	}
}

// TestRestorePause: a view started on a state whose audit log ends in a
// pause (a previous view left the VM frozen) fences the agent, shows the
// pause, and its Resume sends cont.
func TestRestorePause(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws := controlViewer(t, ctx, e, "gina")
	op(ctx, ws, "pause")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["paused"] == true }); err != nil {
		t.Fatal(err)
	}
	// The page is told of the pause once the agent is fenced, which is
	// before QEMU has stopped and the pause is recorded (a state message
	// already on its way shows it too). What a restarted view reads is
	// the audit log, so wait for the record itself.
	waitFor(t, ctx, "the pause to be recorded", func() bool {
		recs, err := auditlog.Read(e.dir) // not there yet before the first record
		return err == nil && len(recs) > 0 && recs[len(recs)-1].Kind == auditlog.KindPause
	})
	// A second adapter on the same VM stands for the restarted view.
	e.srv.Close()
	e.adapter.Close()
	a, err := qmpinput.Open(ctx, qmpinput.Config{Socket: e.vm.QMP, Display: qmpinput.Display{Device: "video0"}, Audit: func(qmpinput.AuditEvent) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	restored, err := RestorePause(e.dir, a)
	if err != nil || !restored {
		t.Fatalf("restore: %v %v", restored, err)
	}
	if err := a.Key(ctx, "z"); !errors.Is(err, qmpinput.ErrFenced) {
		t.Fatalf("agent after the restart: %v", err)
	}
	if err := a.Resume(ctx, "gina"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "QEMU to run", func() bool { st, _ := probeStatus(ctx, e.vm); return st == "running" })
}
