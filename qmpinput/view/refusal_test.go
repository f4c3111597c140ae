package view

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/rfb"
	"github.com/tetherdev/tether/qmpinput/token"
)

// refusedWS asserts a WebSocket dial was refused with 403 before any
// socket opened.
func refusedWS(t *testing.T, what string, ws *websocket.Conn, resp *http.Response, err error) {
	t.Helper()
	if err == nil {
		ws.CloseNow()
		t.Fatalf("%s: a WebSocket opened", what)
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("%s: %v (response %v), want 403 before the upgrade", what, err, resp)
	}
}

// TestRefusals: no token, a wrong, used, expired or revoked token, a
// foreign Origin and a foreign Host are refused, and no WebSocket opens.
func TestRefusals(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, good := e.mint(t, token.RoleControl, time.Hour, "alice")
	for _, c := range []struct {
		name string
		fn   func(*testing.T, context.Context, *env, string)
	}{
		{"no token", refuseNoToken},
		{"wrong token", refuseWrongToken},
		{"foreign origin", refuseForeignOrigin},
		{"used link", refuseUsedLink},
		{"foreign host", refuseForeignHost},
		{"expired token", refuseExpiredToken},
		{"revoked token", refuseRevokedToken},
		{"view role cannot take over or pause", refuseViewRole},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, ctx, e, good) })
	}
}

func refuseNoToken(t *testing.T, ctx context.Context, e *env, good string) {
	c := e.client(e.origin)
	for _, p := range []string{"/ws/control", "/ws/rfb?viewer=x"} {
		ws, resp, err := c.dial(ctx, p)
		refusedWS(t, p, ws, resp, err)
	}
}

func refuseWrongToken(t *testing.T, ctx context.Context, e *env, good string) {
	c := e.client(e.origin)
	forged := good[:17] + strings.Repeat("A", 43)
	if st, code := c.exchange(forged); st != http.StatusForbidden || code != "token_unknown" {
		t.Fatalf("forged secret: %d %s", st, code)
	}
	if st, code := c.exchange("not-a-token"); st != http.StatusForbidden || code != "token_malformed" {
		t.Fatalf("malformed: %d %s", st, code)
	}
	ws, resp, err := c.dial(ctx, "/ws/control")
	refusedWS(t, "after a refused exchange", ws, resp, err)
}

func refuseForeignOrigin(t *testing.T, ctx context.Context, e *env, good string) {
	evil := e.client("http://127.0.0.1:1")
	if st, code := evil.exchange(good); st != http.StatusForbidden || code != "origin" {
		t.Fatalf("exchange from a foreign origin: %d %s", st, code)
	}
	// The foreign page could not use the link: it is still unused.
	c := e.client(e.origin)
	if st, _ := c.exchange(good); st != http.StatusOK {
		t.Fatalf("the link was used up by a refused request: %d", st)
	}
	// A valid cookie sent from a foreign origin (same site: another
	// port on loopback) opens nothing.
	c.origin = "http://127.0.0.1:1"
	ws, resp, err := c.dial(ctx, "/ws/control")
	refusedWS(t, "valid cookie, foreign origin", ws, resp, err)
	c.origin = ""
	ws, resp, err = c.dial(ctx, "/ws/control")
	refusedWS(t, "valid cookie, no origin", ws, resp, err)
}

func refuseUsedLink(t *testing.T, ctx context.Context, e *env, good string) {
	if st, code := e.client(e.origin).exchange(good); st != http.StatusForbidden || code != "token_used" {
		t.Fatalf("second exchange: %d %s", st, code)
	}
}

func refuseForeignHost(t *testing.T, ctx context.Context, e *env, good string) {
	req, _ := http.NewRequest(http.MethodGet, e.origin+"/", nil)
	req.Host = "evil.example:80"
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("rebinding host: %v %v", resp, err)
	}
	resp.Body.Close()
}

func refuseExpiredToken(t *testing.T, ctx context.Context, e *env, good string) {
	_, s := e.mint(t, token.RoleView, time.Minute, "")
	c := e.client(e.origin)
	if st, _ := c.exchange(s); st != http.StatusOK {
		t.Fatalf("exchange: %d", st)
	}
	ws, _, err := c.control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.add(2 * time.Minute)
	defer e.clock.add(-2 * time.Minute)
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "closed" }); err != nil {
		t.Fatalf("the open viewer of an expired token was not closed: %v", err)
	}
	ws2, resp, err := c.dial(ctx, "/ws/control")
	refusedWS(t, "expired token", ws2, resp, err)
	_, s2 := e.mint(t, token.RoleView, time.Minute, "")
	e.clock.add(time.Minute)
	if st, code := e.client(e.origin).exchange(s2); st != http.StatusForbidden || code != "token_expired" {
		t.Fatalf("expired link: %d %s", st, code)
	}
	e.clock.add(-time.Minute)
}

func refuseRevokedToken(t *testing.T, ctx context.Context, e *env, good string) {
	tok, s := e.mint(t, token.RoleView, time.Hour, "")
	c := e.client(e.origin)
	if st, _ := c.exchange(s); st != http.StatusOK {
		t.Fatal(st)
	}
	if _, err := e.store.Revoke(tok.ID); err != nil {
		t.Fatal(err)
	}
	ws, resp, err := c.dial(ctx, "/ws/control")
	refusedWS(t, "revoked token", ws, resp, err)
	tok2, s2 := e.mint(t, token.RoleView, time.Hour, "")
	e.store.Revoke(tok2.ID)
	if st, code := e.client(e.origin).exchange(s2); st != http.StatusForbidden || code != "token_revoked" {
		t.Fatalf("revoked link: %d %s", st, code)
	}
}

func refuseViewRole(t *testing.T, ctx context.Context, e *env, good string) {
	_, s := e.mint(t, token.RoleView, time.Hour, "")
	c := e.client(e.origin)
	c.exchange(s)
	ws, h, err := c.control(ctx)
	if err != nil || h.Role != token.RoleView {
		t.Fatalf("%+v %v", h, err)
	}
	defer ws.CloseNow()
	for _, name := range []string{"takeover", "pause", "resume"} {
		op(ctx, ws, name)
		m, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "error" })
		if err != nil || m["code"] != "forbidden" {
			t.Fatalf("%s by a viewer: %v %v", name, m, err)
		}
	}
	if _, _, paused := e.adapter.Paused(); paused {
		t.Fatal("a view token paused the VM")
	}
}

// TestMalformedRFBClosesOnlyThatViewer: a viewer that sends an unknown
// RFB message is closed (its hold ends); another viewer's screen goes on.
func TestMalformedRFBClosesOnlyThatViewer(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var conns [2]struct {
		ws  *websocket.Conn
		id  string
		tok token.Token
		c   *goClient
	}
	for i := range conns {
		tok, s := e.mint(t, token.RoleControl, time.Hour, "")
		c := e.client(e.origin)
		if st, _ := c.exchange(s); st != http.StatusOK {
			t.Fatal(st)
		}
		ws, h, err := c.control(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		conns[i].ws, conns[i].id, conns[i].tok, conns[i].c = ws, h.Viewer, tok, c
	}
	bad, err := conns[0].c.screen(ctx, conns[0].id)
	if err != nil {
		t.Fatal(err)
	}
	good, err := conns[1].c.screen(ctx, conns[1].id)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if err := op(ctx, conns[0].ws, "takeover"); err != nil {
		t.Fatal(err)
	}
	if _, err := readUntil(ctx, conns[0].ws, func(m map[string]any) bool { return m["holder_is_you"] == true }); err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte{9, 9, 9, 9})
	if _, err := readUntil(ctx, conns[0].ws, func(m map[string]any) bool { return m["type"] == "closed" }); err != nil {
		t.Fatalf("the malformed viewer's control socket: %v", err)
	}
	bad.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := bad.Read(make([]byte, 1<<16)); err == nil {
		for {
			if _, err = bad.Read(make([]byte, 1<<16)); err != nil {
				break
			}
		}
	}
	waitFor(t, ctx, "the hold to end", func() bool { return e.srv.ar.state(nil).Holder == "" })
	if err := e.adapter.Key(ctx, "z"); err != nil {
		t.Fatalf("the agent is still fenced after the malformed viewer was closed: %v", err)
	}
	// The other viewer still gets its screen.
	good.SetDeadline(time.Now().Add(30 * time.Second))
	good.Write(rfb.UpdateRequest{W: 1280, H: 800}.Encode())
	if _, err := good.Read(make([]byte, 4)); err != nil {
		t.Fatalf("the other viewer's screen stopped: %v", err)
	}
	var last auditlog.Record
	for _, r := range e.records(t) {
		if strings.HasPrefix(r.Kind, "handover") {
			last = r
		}
	}
	if last.Kind != "handover_end" || last.Reason != string(qmpinput.EndDisconnected) {
		t.Fatalf("last audit record %+v, want the hold ended as disconnected", last)
	}
}

// TestRevokeEndsHold: revoking the holder's token (as tether-qmp token
// revoke does, from another store) ends the hold as revoked and closes
// the viewer; the agent is unfenced.
func TestRevokeEndsHold(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, s := e.mint(t, token.RoleControl, time.Hour, "bob")
	c := e.client(e.origin)
	c.exchange(s)
	ws, _, err := c.control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	op(ctx, ws, "takeover")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["holder_is_you"] == true }); err != nil {
		t.Fatal(err)
	}
	if err := e.adapter.Key(ctx, "z"); !errors.Is(err, qmpinput.ErrFenced) {
		t.Fatalf("agent during the hold: %v", err)
	}
	other := token.Open(e.dir, nil)
	if _, err := other.Revoke(tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "closed" }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the agent to be unfenced", func() bool { return e.adapter.Key(ctx, "z") == nil })
	var end string
	for _, r := range e.records(t) {
		if r.Kind == "handover_end" {
			end = r.Reason
		}
	}
	if end != string(qmpinput.EndRevoked) {
		t.Fatalf("hold ended as %q, want revoked", end)
	}
}
