package custodian

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/audit"
)

// recordingHandler keeps every record it is given at or above its level.
type recordingHandler struct {
	level slog.Level
	mu    *sync.Mutex
	got   *[]slog.Record
	attrs []slog.Attr
}

func newRecording(level slog.Level) *recordingHandler {
	return &recordingHandler{level: level, mu: &sync.Mutex{}, got: &[]slog.Record{}}
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.got = append(*h.got, r)
	return nil
}
func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}
func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

func (h *recordingHandler) find(msg string) (slog.Record, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range *h.got {
		if r.Message == msg {
			return r, true
		}
	}
	return slog.Record{}, false
}

func (h *recordingHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(*h.got)
}

// TestSDKLogsGoThroughTheCustodianLogger: acp-go-sdk's diagnostics reach
// Options.Logger, never slog.Default; its routine "connection closed"
// (logged at Info whenever the agent goes away) arrives at Debug, so a
// Warn-level logger (the CLI's) stays quiet, while its errors keep their
// level.
func TestSDKLogsGoThroughTheCustodianLogger(t *testing.T) {
	def := newRecording(slog.LevelDebug)
	prev := slog.Default()
	slog.SetDefault(slog.New(def))
	t.Cleanup(func() { slog.SetDefault(prev) })
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelWarn} {
		rec := newRecording(level)
		skey, _, err := audit.GenerateKey("tether.test/custodian")
		must(t, err)
		c, err := New(Options{StateDir: filepath.Join(t.TempDir(), "state"), AuditKey: []byte(skey), Logger: slog.New(rec)})
		must(t, err)
		toAgentR, toAgentW := io.Pipe()
		fromAgentR, fromAgentW := io.Pipe()
		go io.Copy(io.Discard, toAgentR)
		conn := c.Serve(toAgentW, fromAgentR, ConnOptions{})
		fromAgentW.Write([]byte("this is not json-rpc\n"))
		fromAgentW.Close()
		<-conn.Done()
		waitFor(t, func() bool { _, ok := rec.find("failed to parse incoming message"); return ok })
		r, _ := rec.find("failed to parse incoming message")
		if r.Level != slog.LevelError || !hasAttr(r, "component", "acp-go-sdk") {
			t.Fatalf("logger at %s: SDK error arrived at %s, attrs %v; want ERROR from component acp-go-sdk", level, r.Level, attrsOf(r))
		}
		if level == slog.LevelDebug { // logged as the SDK's reader ends, which may come after Done
			waitFor(t, func() bool { _, ok := rec.find("connection closed"); return ok })
		}
		closed, ok := rec.find("connection closed")
		switch {
		case level == slog.LevelDebug && (!ok || closed.Level != slog.LevelDebug):
			t.Fatalf("debug logger: connection closed = %v at %s; want it demoted to DEBUG", ok, closed.Level)
		case level == slog.LevelWarn && ok:
			t.Fatalf("warn logger got the SDK's routine %q at %s; a normal run must stay quiet", closed.Message, closed.Level)
		}
		conn.Close()
		toAgentW.Close()
		must(t, c.Close())
	}
	time.Sleep(20 * time.Millisecond)
	if n := def.count(); n != 0 {
		t.Fatalf("slog.Default received %d SDK records; they must go through Options.Logger", n)
	}
}

func hasAttr(r slog.Record, key, value string) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key && a.Value.String() == value {
			found = true
			return false
		}
		return true
	})
	return found
}

func attrsOf(r slog.Record) []slog.Attr {
	var out []slog.Attr
	r.Attrs(func(a slog.Attr) bool { out = append(out, a); return true })
	return out
}
