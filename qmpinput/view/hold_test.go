package view

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tetherdev/tether/qmpinput"
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
