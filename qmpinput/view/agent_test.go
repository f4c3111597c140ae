package view

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// agentRun sends one script to the agent socket and returns its lines.
func agentRun(t *testing.T, path, script string) []map[string]any {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write([]byte(script))
	c.(*net.UnixConn).CloseWrite()
	var out []map[string]any
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("agent line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func startAgentSocket(t *testing.T, e *env, uid uint32) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeAgent(ctx, l, e.adapter, uid, 10*time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return path
}

// TestAgentSocketIsFenced: scripts sent through the view's agent socket
// run on the view's adapter: fenced while a person holds input, free
// again after the hand back; a peer of another uid is refused.
func TestAgentSocketIsFenced(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := startAgentSocket(t, e, uint32(myUID()))
	if out := agentRun(t, path, "capture\nkey z\n"); len(out) != 2 || out[0]["ok"] != true || out[1]["ok"] != true {
		t.Fatalf("agent script before any hold: %v", out)
	}
	ws := controlViewer(t, ctx, e, "erin")
	takeOver(t, ctx, ws)
	out := agentRun(t, path, "key z\ncapture\n")
	if len(out) != 2 || out[0]["code"] != "fenced" || out[1]["skipped"] != true {
		t.Fatalf("agent script during the hold: %v", out)
	}
	op(ctx, ws, "handback")
	if _, err := readUntil(ctx, ws, func(m map[string]any) bool { return m["type"] == "state" && m["holder"] == "" }); err != nil {
		t.Fatal(err)
	}
	if out := agentRun(t, path, "click 5 5\n"); len(out) != 1 || out[0]["code"] != "no_capture" {
		t.Fatalf("agent click after the hand back: %v, want no_capture", out)
	}
	other := startAgentSocket(t, e, uint32(myUID())+1)
	if out := agentRun(t, other, "key z\n"); len(out) != 1 || out[0]["code"] != "socket_owner" {
		t.Fatalf("agent of another uid: %v", out)
	}
}

// TestStateSaysAgentHoldsOnlyOnceUnfenced: between a hold's release and
// the lifting of the fence (the end record being written) the agent is
// still fenced, so no page may be told it holds input yet: a viewer
// connecting in that window is told erin holds input, and an agent
// script that acted on it would be fenced. Only after the fence lifts
// does a state say the agent holds input, and then the agent's click
// runs (no_capture: it must capture first). The window is held open by
// blocking the end record, so the order is pinned, not hoped for.
func TestStateSaysAgentHoldsOnlyOnceUnfenced(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := startAgentSocket(t, e, uint32(myUID()))
	ws := controlViewer(t, ctx, e, "erin")
	takeOver(t, ctx, ws)
	inWindow, proceed := make(chan struct{}), make(chan struct{})
	hook := func() { close(inWindow); <-proceed }
	e.onEnd.Store(&hook)
	t.Cleanup(func() {
		select {
		case <-proceed:
		default:
			close(proceed)
		}
	})
	op(ctx, ws, "handback")
	select {
	case <-inWindow:
	case <-ctx.Done():
		t.Fatal("the hand back wrote no end record")
	}
	if out := agentRun(t, path, "click 5 5\n"); len(out) != 1 || out[0]["code"] != "fenced" {
		t.Fatalf("agent click while the end is recorded: %v, want fenced", out)
	}
	watcher := controlViewer(t, ctx, e, "watcher")
	st, err := readUntil(ctx, watcher, func(m map[string]any) bool { return m["type"] == "state" })
	if holder, _ := st["holder"].(string); err != nil || !strings.HasPrefix(holder, "erin (") {
		t.Fatalf("state told a page while the agent is still fenced: %v, %v; want holder erin", st, err)
	}
	close(proceed)
	for _, c := range []*websocket.Conn{ws, watcher} {
		if _, err := readUntil(ctx, c, func(m map[string]any) bool { return m["type"] == "state" && m["holder"] == "" }); err != nil {
			t.Fatal(err)
		}
	}
	if out := agentRun(t, path, "click 5 5\n"); len(out) != 1 || out[0]["code"] != "no_capture" {
		t.Fatalf("agent click after the state said the agent holds input: %v, want no_capture", out)
	}
}

func myUID() int { return os.Geteuid() }
