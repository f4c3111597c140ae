package ratelog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the timer goroutine's writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFloodIsBounded: 10,000 refusals of two reasons within one window
// give one line each at once and one count line each at the window's end
// (or at Close), whatever their number.
func TestFloodIsBounded(t *testing.T) {
	var buf syncBuffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "refused", time.Hour)
	for i := range 10000 {
		l.Refused([]string{"limit", "peer limit"}[i%2], "ip:127.0.0.1", errors.New("over"))
	}
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines during the flood, want 2:\n%s", n, buf.String())
	}
	l.Close()
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 4 {
		t.Fatalf("%d lines after Close, want 4:\n%s", n, out)
	}
	for _, want := range []string{`reason=limit count=4999`, `reason="peer limit" count=4999`} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	l.Refused("limit", "x", nil) // after Close: dropped
	l.Close()
	if strings.Count(buf.String(), "\n") != 4 {
		t.Fatalf("a refusal after Close was logged:\n%s", buf.String())
	}
}

// TestWindowEndsWithCount: the count line comes when the window ends, and
// the next refusal opens a new window and is logged at once.
func TestWindowEndsWithCount(t *testing.T) {
	var buf syncBuffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "refused", 50*time.Millisecond)
	defer l.Close()
	for range 3 {
		l.Refused("limit", "p", nil)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "count=2") {
		if time.Now().After(deadline) {
			t.Fatalf("no count line after the window:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Refused("limit", "q", nil)
	if !strings.Contains(buf.String(), "peer=q") {
		t.Fatalf("the first refusal of a new window was not logged:\n%s", buf.String())
	}
}
