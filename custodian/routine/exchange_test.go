package routine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAskUnclaimedIsWithdrawn: with no server, Ask ends with ErrNoAnswer
// and leaves no request behind, so a server started later runs nothing.
func TestAskUnclaimedIsWithdrawn(t *testing.T) {
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Ask(ctx, state, RunRequest{Name: "build", OpKey: "k1", SessionID: "s1"}, 10*time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("Ask with no server: %v, want ErrNoAnswer", err)
	}
	entries, err := os.ReadDir(filepath.Join(state, Dir, requestsDir))
	if err != nil || len(entries) != 0 {
		t.Fatalf("request directory after a withdrawn ask: %v, %d entries", err, len(entries))
	}
	var ran atomic.Int32
	serveOnce(context.Background(), filepath.Join(state, Dir, requestsDir), func(context.Context, RunRequest) RunAnswer {
		ran.Add(1)
		return RunAnswer{}
	})
	if ran.Load() != 0 {
		t.Fatal("a withdrawn request ran")
	}
}

// TestAskServed: a serving custodian runs each request once and its
// answer reaches the asker.
func TestAskServed(t *testing.T) {
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ran atomic.Int32
	done := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() {
		done <- Serve(sctx, state, 10*time.Millisecond, func(_ context.Context, req RunRequest) RunAnswer {
			ran.Add(1)
			return RunAnswer{Code: "denied", Message: req.Name + " " + req.OpKey + " " + req.SessionID}
		})
	}()
	ans, err := Ask(ctx, state, RunRequest{Name: "build", OpKey: "k1", SessionID: "s1"}, 10*time.Millisecond)
	stop()
	<-done
	if err != nil || ans.Code != "denied" || ans.Message != "build k1 s1" || ran.Load() != 1 {
		t.Fatalf("answer %+v, err %v, ran %d", ans, err, ran.Load())
	}
}

// FuzzRunRequest: whatever a request file holds, answering it never
// panics, and run is called only for a request that decodes strictly.
func FuzzRunRequest(f *testing.F) {
	f.Add([]byte(`{"name":"build","op_key":"k1","session_id":"s1"}`))
	f.Add([]byte(`{"name":"build","op_key":"k1","session_id":"s1","extra":1}`))
	f.Add([]byte(`{"name":1}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "run-x"+extClaimed)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		called := false
		ans := answer(context.Background(), p, func(context.Context, RunRequest) RunAnswer {
			called = true
			return RunAnswer{Code: "ok"}
		})
		if called != (ans.Code == "ok") || (!called && ans.Code != "invalid") {
			t.Fatalf("answer %+v, run called %v", ans, called)
		}
	})
}
