package custodian

import (
	"context"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// scriptExec makes exec_start answer terminal "t1"; exec_wait answers
// exit with the given code and file digests.
func (h *harness) scriptExec(code int, files map[string]string) {
	h.fr.on(wire.OpExecStart, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		return wire.ExecStartResult{TerminalID: "t1", PID: 4242}, nil
	})
	h.fr.on(wire.OpExecWait, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		return wire.ExecWaitResult{Exit: wire.ExitStatus{ExitCode: &code}, FileSHA256: files}, nil
	})
	h.fr.on(wire.OpExecOutput, func(context.Context, *wire.Request, any) (any, error) {
		return wire.ExecOutputResult{Output: "SECRET-OUTPUT", Exit: &wire.ExitStatus{ExitCode: &code}}, nil
	})
	h.fr.on(wire.OpExecRelease, func(context.Context, *wire.Request, any) (any, error) { return wire.Empty{}, nil })
	h.fr.on(wire.OpExecKill, func(context.Context, *wire.Request, any) (any, error) { return wire.Empty{}, nil })
}

// run drives create, wait, output, release with op keys prefixed by key.
func (h *harness) run(key string, verify map[string]string) (*opstore.Receipt, error) {
	ctx := context.Background()
	meta := h.op(key + ":create")
	if verify != nil {
		meta = acpmeta.MergeMeta(meta, acpmeta.Verify{Files: verify}.Meta())
	}
	cwd := h.tuple.Root + "/build"
	created, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "make",
		Args: []string{"all"}, Cwd: &cwd, Env: []acp.EnvVariable{{Name: "PATH", Value: "/usr/bin"}}, Meta: meta})
	if err != nil {
		return nil, err
	}
	tid := created.TerminalId
	if _, err := h.agent.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid(h), TerminalId: tid, Meta: h.op(key + ":wait")}); err != nil {
		return nil, err
	}
	if _, err := h.agent.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid(h), TerminalId: tid, Meta: h.op(key + ":output")}); err != nil {
		return nil, err
	}
	if _, err := h.agent.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid(h), TerminalId: tid, Meta: h.op(key + ":release")}); err != nil {
		return nil, err
	}
	raw, err := h.c.store.Get(h.key(key + ":create"))
	if err != nil {
		return nil, err
	}
	return opstore.Unmarshal(raw)
}

func TestExecOutcomes(t *testing.T) {
	good, bad := strings.Repeat("1", 64), strings.Repeat("2", 64)
	cases := []struct {
		name   string
		code   int
		verify map[string]string
		got    map[string]string
		want   opstore.Outcome
	}{
		{"exit 0 alone", 0, nil, nil, opstore.NeedsReview},
		{"verified", 0, map[string]string{"out/a": good}, map[string]string{"out/a": good}, opstore.Verified},
		{"digest mismatch", 0, map[string]string{"out/a": good}, map[string]string{"out/a": bad}, opstore.Failed},
		{"file missing", 0, map[string]string{"out/a": good}, map[string]string{"out/a": ""}, opstore.Failed},
		{"exit 2", 2, map[string]string{"out/a": good}, map[string]string{"out/a": good}, opstore.Failed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.scriptExec(c.code, c.got)
			h.bind()
			r, err := h.run("x", c.verify)
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcome != c.want {
				t.Fatalf("outcome %s, want %s (receipt %+v)", r.Outcome, c.want, r)
			}
			start := h.fr.calls[1]
			args, _ := start.DecodeArgs()
			ea := args.(*wire.ExecStartArgs)
			if ea.Cwd != "build" || ea.Argv[0] != "make" || ea.Env["PATH"] != "/usr/bin" || len(ea.HashAfterExit) != len(c.verify) {
				t.Fatalf("exec_start args %+v", ea)
			}
		})
	}
}

func TestExecCreateRetryReplaysTerminal(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	req := acp.CreateTerminalRequest{SessionId: sid(h), Command: "/bin/date", Meta: h.op("c1")}
	a, err := h.agent.conn.CreateTerminal(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.agent.conn.CreateTerminal(ctx, req)
	if err != nil || a.TerminalId != b.TerminalId || h.fr.count(wire.OpExecStart) != 1 {
		t.Fatalf("retry: %v %v, %d starts", b, err, h.fr.count(wire.OpExecStart))
	}
	req.Args = []string{"-u"}
	_, err = h.agent.conn.CreateTerminal(ctx, req)
	wantCode(t, err, errcode.CodeOpKeyConflict)
}

func TestForeignTerminalIsNotFound(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.bind()
	n := len(h.fr.ops())
	_, err := h.agent.conn.KillTerminal(context.Background(), acp.KillTerminalRequest{SessionId: sid(h), TerminalId: "someone-elses", Meta: h.op("k")})
	wantCode(t, err, errcode.CodeNotFound)
	if len(h.fr.ops()) != n {
		t.Fatal("a kill for an unknown terminal reached the receiver")
	}
}

func TestTerminalKillReachesReceiver(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	c, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "sleep", Args: []string{"60"}, Meta: h.op("c")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.agent.conn.KillTerminal(ctx, acp.KillTerminalRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("k")}); err != nil {
		t.Fatal(err)
	}
	if req := h.fr.last(); req.Op != wire.OpExecKill || req.OpKey != "k" {
		t.Fatalf("last receiver call %+v, want exec_kill", req)
	}
}

// TestCancelledWaitKillsTheChild: the agent cancels its wait
// ($/cancel_request, sent by the SDK when the caller's ctx ends); the
// custodian kills the child through the receiver. The wait asked the
// receiver to release the terminal with its answer, so that answer (the
// exit the kill brought) is still taken after the cancel, never
// abandoned: the receipt records the exit, and the release afterwards
// sends nothing (the receiver forgot the terminal). With the wait's
// request following the agent's cancel, the exit would be lost.
func TestCancelledWaitKillsTheChild(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	killed := make(chan string, 1)
	h.fr.on(wire.OpExecWait, func(ctx context.Context, _ *wire.Request, a any) (any, error) {
		if !a.(*wire.TerminalArgs).Release {
			return nil, errcode.Errorf(errcode.CodeInvalid, "the custodian's wait should release")
		}
		select {
		case <-ctx.Done():
			return nil, errcode.Errorf(errcode.CodeTimeout, "wait ended")
		case id := <-killed:
			killed <- id
			out := ""
			return wire.ExecWaitResult{Exit: wire.ExitStatus{Signal: "KILL"}, Output: &out, Released: true}, nil
		}
	})
	h.fr.on(wire.OpExecKill, func(_ context.Context, _ *wire.Request, a any) (any, error) {
		killed <- a.(*wire.TerminalArgs).TerminalID
		return wire.Empty{}, nil
	})
	h.bind()
	c, err := h.agent.conn.CreateTerminal(context.Background(), acp.CreateTerminalRequest{SessionId: sid(h), Command: "sleep", Meta: h.op("c")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		waitFor(t, func() bool { return h.fr.count(wire.OpExecWait) == 1 })
		cancel()
	}()
	_, err = h.agent.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("w")})
	if err == nil {
		t.Fatal("cancelled wait returned no error")
	}
	select {
	case id := <-killed:
		if id != c.TerminalId {
			t.Fatalf("killed %q, want %q", id, c.TerminalId)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the child was not killed after the agent cancelled")
	}
	waitFor(t, func() bool {
		raw, err := h.c.store.Get(h.key("c"))
		r, _ := opstore.Unmarshal(raw)
		return err == nil && r != nil && r.Outcome != opstore.Pending
	})
	raw, err := h.c.store.Get(h.key("c"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := opstore.Unmarshal(raw)
	if err != nil || r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.Signal != "KILL" {
		t.Fatalf("receipt %+v (%v): want failed, killed by KILL, from the answer taken after the cancel", r, err)
	}
	if _, err := h.agent.conn.ReleaseTerminal(context.Background(), acp.ReleaseTerminalRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("r")}); err != nil {
		t.Fatal(err)
	}
	if n := h.fr.count(wire.OpExecRelease); n != 0 {
		t.Fatalf("%d exec_release sent after the wait released the terminal, want 0", n)
	}
}

// TestTransportLoss: a request in flight when the receiver connection
// breaks ends fate_unknown, its key is interrupted and never re-sent, the
// binding is fenced until a new attach succeeds on the new connection.
func TestTransportLoss(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.fr.on(wire.OpExecStart, func(ctx context.Context, _ *wire.Request, _ any) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	h.bind()
	ctx := context.Background()
	go func() {
		waitFor(t, func() bool { return h.fr.count(wire.OpExecStart) == 1 })
		h.dropReceiver()
	}()
	req := acp.CreateTerminalRequest{SessionId: sid(h), Command: "/usr/bin/make", Meta: h.op("lost")}
	_, err := h.agent.conn.CreateTerminal(ctx, req)
	wantCode(t, err, errcode.CodeFateUnknown)
	raw, _ := h.c.store.Get(h.key("lost"))
	if r, _ := opstore.Unmarshal(raw); r.Outcome != opstore.Interrupted {
		t.Fatalf("receipt after loss = %s", raw)
	}
	_, err = h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "/bin/true", Meta: h.op("next")})
	wantCode(t, err, errcode.CodeFenced)
	waitFor(t, func() bool { _, _, err := h.recv.current(ctx, false); return err == nil })
	if err := h.attach(); err != nil {
		t.Fatalf("reattach after reconnect: %v", err)
	}
	_, err = h.agent.conn.CreateTerminal(ctx, req)
	wantCode(t, err, errcode.CodeInterrupted) // the replayed receipt, not a re-send
	if n := h.fr.count(wire.OpExecStart); n != 1 {
		t.Fatalf("exec_start sent %d times; a lost request must never be re-sent", n)
	}
}

// TestAuditHoldsDigestsNotContents writes a secret and reads output; the
// audit log must hold neither, and must verify.
func TestAuditHoldsDigestsNotContents(t *testing.T) {
	h := newHarness(t)
	h.scriptFiles()
	h.scriptExec(0, nil)
	h.bind()
	ctx := context.Background()
	secret := "SECRET-CONTENT-4f1c"
	if _, err := h.agent.conn.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: sid(h), Path: h.tuple.Root + "/private/notes.txt", Content: secret, Meta: h.op("w")}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.run("e", nil); err != nil {
		t.Fatal(err)
	}
	h.agent.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: "nope", Path: "/x", Meta: h.op("z")})
	log := auditRecords(t, h)
	for _, leak := range []string{secret, "SECRET-OUTPUT", "private/notes.txt", "make"} {
		if strings.Contains(log, leak) {
			t.Fatalf("audit log contains %q", leak)
		}
	}
	for _, kind := range []string{`"kind":"bind"`, `"kind":"attach"`, `"kind":"dispatch"`, `"kind":"result"`, `"kind":"refusals"`} {
		if !strings.Contains(log, kind) {
			t.Fatalf("audit log has no %s record:\n%s", kind, log)
		}
	}
	if !strings.Contains(log, sha256Hex([]byte(secret))) {
		t.Fatal("audit log lacks the written content's digest")
	}
}

// TestRunCommandSendsNoRedundantWait: create, wait, output, release (what
// run_command sends) make exactly one exec_wait: output showing an exit
// the wait already recorded asks the receiver nothing more.
func TestRunCommandSendsNoRedundantWait(t *testing.T) {
	for _, verify := range []map[string]string{nil, {"out/a": strings.Repeat("1", 64)}} {
		h := newHarness(t)
		h.scriptExec(0, verify)
		h.bind()
		r, err := h.run("x", verify)
		if err != nil {
			t.Fatal(err)
		}
		if n := h.fr.count(wire.OpExecWait); n != 1 {
			t.Fatalf("verify=%v: %d exec_wait calls (%v), want 1", verify != nil, n, h.fr.ops())
		}
		if want := map[bool]opstore.Outcome{false: opstore.NeedsReview, true: opstore.Verified}[verify != nil]; r.Outcome != want {
			t.Fatalf("verify=%v: outcome %s, want %s", verify != nil, r.Outcome, want)
		}
	}
}

// TestOutputExitCompletesReceipt: an agent that never waits, only reads
// output until it shows the exit, gets an exact receipt; exec_wait is
// asked only when the create named files to verify (their digests).
func TestOutputExitCompletesReceipt(t *testing.T) {
	good := strings.Repeat("1", 64)
	for _, verify := range []map[string]string{nil, {"out/a": good}} {
		h := newHarness(t)
		h.scriptExec(2, map[string]string{"out/a": good})
		h.bind()
		ctx := context.Background()
		meta := h.op("c:create")
		if verify != nil {
			meta = acpmeta.MergeMeta(meta, acpmeta.Verify{Files: verify}.Meta())
		}
		c, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "make", Meta: meta})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.agent.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("c:out")}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.agent.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("c:rel")}); err != nil {
			t.Fatal(err)
		}
		if n, want := h.fr.count(wire.OpExecWait), len(verify); n != want {
			t.Fatalf("verify=%v: %d exec_wait calls, want %d", verify != nil, n, want)
		}
		raw, _ := h.c.store.Get(h.key("c:create"))
		r, _ := opstore.Unmarshal(raw)
		if r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 2 || r.Note != "" {
			t.Fatalf("verify=%v: receipt %s", verify != nil, raw)
		}
		if verify != nil && (len(r.Files) != 1 || r.Files[0].Actual != good) {
			t.Fatalf("file checks %+v, want the digest exec_wait fetched", r.Files)
		}
	}
}

// TestOutputExitDigestsUnavailable: output shows exit 0 of an exec that
// asked for digests, but they cannot be fetched before the release. The
// receipt records the exit and is failed, saying the digests were never
// fetched: nothing was verified.
func TestOutputExitDigestsUnavailable(t *testing.T) {
	h := newHarness(t)
	h.scriptExec(0, nil)
	h.fr.on(wire.OpExecWait, func(context.Context, *wire.Request, any) (any, error) {
		return nil, errcode.Errorf(errcode.CodeUnavailable, "receiver busy")
	})
	h.bind()
	ctx := context.Background()
	meta := acpmeta.MergeMeta(h.op("d:create"), acpmeta.Verify{Files: map[string]string{"out/a": strings.Repeat("1", 64)}}.Meta())
	c, err := h.agent.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid(h), Command: "make", Meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.agent.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("d:out")}); err != nil {
		t.Fatal(err)
	}
	raw, _ := h.c.store.Get(h.key("d:create"))
	if r, _ := opstore.Unmarshal(raw); r.Outcome != opstore.Pending {
		t.Fatalf("receipt before release: %s, want pending (the digests may still come)", raw)
	}
	if _, err := h.agent.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid(h), TerminalId: c.TerminalId, Meta: h.op("d:rel")}); err != nil {
		t.Fatal(err)
	}
	raw, _ = h.c.store.Get(h.key("d:create"))
	r, _ := opstore.Unmarshal(raw)
	if r.Outcome != opstore.Failed || r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 0 || r.Note != noteDigestsNotFetched {
		t.Fatalf("receipt %s: want failed with exit 0 and the note %q", raw, noteDigestsNotFetched)
	}
}
