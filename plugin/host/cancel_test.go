package host_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/plugin/host"
)

// TestRunCommandCancelCleansUpBeforeReturning: a cancelled run_command
// returns only after its terminal was killed and released; it reports a
// cancellation (never internal) carrying the killed command's result.
func TestRunCommandCancelCleansUpBeforeReturning(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, cancel := context.WithCancel(ctxT(t))
	var once sync.Once
	l.client.OnTerminal = func(m string) {
		if m == "terminal/create" {
			once.Do(func() { time.AfterFunc(300*time.Millisecond, cancel) })
		}
	}
	start := time.Now()
	resp, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/sh",
		Args: []string{"-c", "echo started; exec sleep 30"}})
	// At the moment the call returns, nothing is left: no polling.
	running, kills, releases := l.client.Running(), len(callsOf(l.client, "terminal/kill")), len(callsOf(l.client, "terminal/release"))
	var ce *host.CancelledError
	if !errors.Is(err, host.ErrCancelled) || !errors.As(err, &ce) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run_command: %v (%T)", err, err)
	}
	if code, ok := acperr.CodeOf(err); ok {
		t.Fatalf("a cancel carries tether code %q", code)
	}
	if running != 0 || kills != 1 || releases != 1 {
		t.Fatalf("when the call returned: %d running, %d kills, %d releases; want 0, 1, 1", running, kills, releases)
	}
	if ce.Run == nil || *ce.Run != resp || !resp.Cancelled || resp.TimedOut || signal(resp) != "killed" ||
		resp.Output != "started\n" || resp.OpKey == "" {
		t.Fatalf("the cancelled command's result: %+v (in the error: %+v)", resp, ce.Run)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	// The session is still bound: a cancel is not a binding failure.
	readOK(t, l, "s1")
}

// TestCancelledCallSendsNothingMore: once the caller cancels, the host
// sends none of the call's further requests: an edit cancelled after its
// read never writes, and reports the cancel.
func TestCancelledCallSendsNothingMore(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	f := filepath.Join(l.client.Root, "doc.txt")
	if err := os.WriteFile(f, []byte("alpha beta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	l.client.AfterRead = func(string) { cancel() }
	_, err := l.conn.EditTextFile(ctx, "s1", host.CallOptions{}, "doc.txt", "beta", "BETA")
	if !errors.Is(err, host.ErrCancelled) {
		t.Fatalf("edit cancelled after its read: %v", err)
	}
	if n := len(callsOf(l.client, "fs/write_text_file")); n != 0 {
		t.Fatalf("%d writes sent after the cancel", n)
	}
	if b, _ := os.ReadFile(f); string(b) != "alpha beta\n" {
		t.Fatalf("file changed: %q", b)
	}
	// A call whose ctx is already done sends nothing at all.
	before := len(l.client.Calls())
	_, err = l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/true"})
	if !errors.Is(err, host.ErrCancelled) || len(l.client.Calls()) != before {
		t.Fatalf("run on a cancelled ctx: %v, %d callbacks", err, len(l.client.Calls())-before)
	}
	readOK(t, l, "s1")
}

// TestGlobCancelled: a cancelled shell tool (glob, grep, list_directory)
// reports the cancel after its command was killed and released.
func TestGlobCancelled(t *testing.T) {
	p := loadPlugin(t)
	l, _ := bound(t, p)
	ctx, cancel := context.WithCancel(ctxT(t))
	// The glob's command ends at once: the client holds the wait until
	// the cancellation reaches it, so the glob is cancelled while the
	// wait is in flight, never answered by an exit that raced the cancel.
	l.client.OnWait = func(wctx context.Context) {
		cancel()
		select {
		case <-wctx.Done():
		case <-time.After(30 * time.Second): // a bound; the glob then returns its result and the test fails
		}
	}
	_, err := l.conn.Glob(ctx, "s1", host.CallOptions{}, "*", "")
	if !errors.Is(err, host.ErrCancelled) || l.client.Running() != 0 || len(callsOf(l.client, "terminal/release")) != 1 {
		t.Fatalf("cancelled glob: %v, %d running", err, l.client.Running())
	}
}

// TestCancelCleanupNeedsNoPlugin: once the plan is issued, a cancel's
// clean-up (kill, output, release) is the host's alone: with the plugin
// process killed while the command runs, the cancelled call still kills
// and releases the command before it returns.
func TestCancelCleanupNeedsNoPlugin(t *testing.T) {
	path, sum := selfBinary(t)
	p, err := host.Load(ctxT(t), path, sum, host.WithArgs(helperArg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, _ := bound(t, p)
	ctx, cancel := context.WithCancel(ctxT(t))
	l.client.OnTerminal = func(m string) {
		if m == "terminal/create" {
			_ = p.Close() // the plugin is gone from here on
			time.AfterFunc(200*time.Millisecond, cancel)
		}
	}
	resp, err := l.conn.RunCommand(ctx, "s1", host.CallOptions{}, host.Command{Command: "/bin/sleep", Args: []string{"30"}})
	running := l.client.Running()
	if !errors.Is(err, host.ErrCancelled) || !resp.Cancelled || signal(resp) != "killed" {
		t.Fatalf("cancel with the plugin gone: %+v, %v", resp, err)
	}
	if running != 0 || len(callsOf(l.client, "terminal/kill")) != 1 || len(callsOf(l.client, "terminal/release")) != 1 {
		t.Fatalf("%d terminals still running when the call returned", running)
	}
	if !p.Exited() {
		t.Fatal("the plugin still runs")
	}
}
