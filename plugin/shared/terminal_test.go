package shared

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/acptest"
)

const testDigest = "ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"

// terminalRig is a real ACP connection (acp-go-sdk on both ends, over
// pipes) to the test client, which runs real processes.
func terminalRig(t *testing.T) (*acp.AgentSideConnection, *acptest.Client) {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	client := &acptest.Client{Root: root}
	client.Bind("s1", testDigest)
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	asc := acp.NewAgentSideConnection(idle{}, a2cW, c2aR)
	csc := acp.NewClientSideConnection(client, c2aW, a2cR)
	quiet := slog.New(slog.DiscardHandler)
	asc.SetLogger(quiet)
	csc.SetLogger(quiet)
	t.Cleanup(func() { c2aW.Close(); a2cW.Close(); c2aR.Close(); a2cR.Close() })
	return asc, client
}

func op(step string) map[string]any {
	return RawMeta(acpmeta.KeyOp, acpmeta.Op{TupleSHA256: testDigest, OpKey: "k:" + step, Deadline: time.Now().Add(time.Minute)})
}

func run(argv []string, deadline time.Duration) TerminalRun {
	return TerminalRun{Create: acp.CreateTerminalRequest{SessionId: "s1", Command: argv[0], Args: argv[1:], Meta: op("create")},
		Deadline: time.Now().Add(deadline), CleanupTimeout: 5 * time.Second,
		WaitMeta: op("wait"), KillMeta: op("kill"), OutputMeta: op("output"), ReleaseMeta: op("release")}
}

// methods returns the methods the client saw, in order.
func methods(c *acptest.Client) string {
	var m []string
	for _, call := range c.Calls() {
		m = append(m, strings.TrimPrefix(call.Method, "terminal/"))
	}
	return strings.Join(m, ",")
}

func TestRunTerminalSequence(t *testing.T) {
	ctx := context.Background()
	t.Run("exits", func(t *testing.T) {
		asc, c := terminalRig(t)
		r := RunTerminal(ctx, asc, run([]string{"/bin/sh", "-c", "echo hi; exit 3"}, time.Minute), nil)
		if r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 3 || r.Output != "hi\n" || r.TimedOut || r.Cancelled ||
			len(r.Steps.Errors()) != 0 || methods(c) != "create,wait_for_exit,output,release" {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
	t.Run("deadline", func(t *testing.T) {
		asc, c := terminalRig(t)
		r := RunTerminal(ctx, asc, run([]string{"/bin/sleep", "30"}, 200*time.Millisecond), nil)
		if !r.TimedOut || r.Cancelled || r.Exit == nil || r.Exit.Signal == nil || *r.Exit.Signal != "killed" ||
			methods(c) != "create,wait_for_exit,kill,output,release" || c.Running() != 0 {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
	t.Run("stopped", func(t *testing.T) {
		asc, c := terminalRig(t)
		stop, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		r := RunTerminal(ctx, asc, run([]string{"/bin/sleep", "30"}, time.Minute), stop)
		if r.TimedOut || !r.Cancelled || methods(c) != "create,wait_for_exit,kill,output,release" || c.Running() != 0 {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
	t.Run("stopped_before", func(t *testing.T) {
		asc, c := terminalRig(t)
		stop, cancel := context.WithCancel(ctx)
		cancel()
		r := RunTerminal(ctx, asc, run([]string{"/bin/true"}, time.Minute), stop)
		if !r.Cancelled || r.Steps.Create.Sent || methods(c) != "" {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
	t.Run("plugin_gone", func(t *testing.T) {
		asc, c := terminalRig(t)
		gone, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		r := RunTerminal(gone, asc, run([]string{"/bin/sleep", "30"}, time.Minute), nil)
		if !r.Cancelled || r.Steps.Kill.Err != nil || r.Steps.Release.Err != nil || c.Running() != 0 {
			t.Fatalf("%+v; client saw %s, %d running", r, methods(c), c.Running())
		}
	})
	// The wait reaches the client after the run's deadline (a loaded
	// machine; here its op tag's deadline has passed already, the plugin's
	// timer not yet): the client refuses it as late, and the run is timed
	// out exactly as if the plugin's timer had fired first.
	t.Run("wait_late", func(t *testing.T) {
		asc, c := terminalRig(t)
		rr := run([]string{"/bin/sleep", "30"}, time.Minute)
		rr.WaitMeta = RawMeta(acpmeta.KeyOp, acpmeta.Op{TupleSHA256: testDigest, OpKey: "k:wait", Deadline: time.Now().Add(-time.Millisecond)})
		r := RunTerminal(ctx, asc, rr, nil)
		if !r.TimedOut || r.Cancelled || r.Steps.Wait.Err != nil || r.Exit == nil || r.Exit.Signal == nil || *r.Exit.Signal != "killed" ||
			methods(c) != "create,wait_for_exit,kill,output,release" || c.Running() != 0 {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
	t.Run("wait_refused", func(t *testing.T) {
		asc, c := terminalRig(t)
		rr := run([]string{"/bin/sleep", "30"}, time.Minute)
		rr.WaitMeta = RawMeta(acpmeta.KeyOp, acpmeta.Op{TupleSHA256: strings.Repeat("0", 64), OpKey: "k:wait", Deadline: time.Now().Add(time.Minute)})
		r := RunTerminal(ctx, asc, rr, nil)
		if code, _ := acpmeta.CodeOf(r.Steps.Wait.Err); code != "tuple_mismatch" || r.Steps.Kill.Sent || r.Steps.Output.Sent ||
			!r.Steps.Release.Sent || c.Running() != 0 {
			t.Fatalf("%+v; client saw %s", r, methods(c))
		}
	})
}

// idle is the agent side of the rig; the client never calls it.
type idle struct{ acp.Agent }
