package transport

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAttackRefusedUnixPeersLogBounded: 1,000 connections from a uid the
// socket does not allow are each refused inside Accept, and the log grows
// by a bounded number of lines (first refusal, then a count), not one
// line per connection.
func TestAttackRefusedUnixPeersLogBounded(t *testing.T) {
	logs := &logBuffer{}
	u := Unix{Path: socketPath(t), HostOnly: true, PeerUIDs: []uint32{60999}, // not us
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	l, err := u.Listen(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	accepted := make(chan error, 1)
	go func() { _, err := l.Accept(ctx); accepted <- err }()
	for range 1000 {
		c, err := net.Dial("unix", u.Path)
		if err != nil {
			t.Fatal(err)
		}
		closedBy(t, c, 10*time.Second)
		c.Close()
	}
	cancel()
	if err := <-accepted; err == nil {
		t.Fatal("Accept returned a refused peer")
	}
	l.Close()
	out := logs.String()
	if n := strings.Count(out, "\n"); n != 2 || !strings.Contains(out, "count=999") {
		t.Fatalf("1000 refused peers logged %d lines, want 2 (the first, then count=999):\n%.2000s", n, out)
	}
}
