package custodian

import (
	"context"
	"sort"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// CreateTerminal serves terminal/create: the child starts inside the
// computer, as the grant's user, keyed at most once per op key. With
// `_meta["tether/verify"]` the receiver hashes the named files after exit
// and the receipt can become verified. If the agent cancels the request
// while the child starts, the child is killed through the receiver.
func (h *client) CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalCreate, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.CreateTerminalResponse{}, err
	}
	args, verify, err := cl.execArgs(p)
	if err != nil {
		return acp.CreateTerminalResponse{}, err
	}
	var res wire.ExecStartResult
	k := keyed{op: wire.OpExecStart, args: args, result: &res,
		settle: func() (any, *opstore.Receipt) {
			return acp.CreateTerminalResponse{TerminalId: res.TerminalID},
				&opstore.Receipt{Outcome: opstore.Pending, TerminalID: res.TerminalID,
					Exec: cl.execRecord(args)}
		},
		annotate: annotation{digests: execDigests(args),
			sizes: map[string]int64{"argv": int64(len(args.Argv)), "env": int64(len(args.Env)), "verify": int64(len(verify))}}.apply,
	}
	if len(verify) > 0 {
		k.extra = verify
	}
	var replayed *opstore.Receipt
	k.onReplay = func(r *opstore.Receipt) { replayed = r }
	resp, err := decodeResponse[acp.CreateTerminalResponse](cl.keyed(ctx, k))
	createKey := opstore.Key(cl.b.Digest, cl.b.ID, cl.Op.OpKey)
	switch {
	case err == nil && replayed != nil && replayed.Outcome.Final():
		// A retry of a finished command: its terminal may be released, or
		// may never have existed here (another custodian recorded it), so
		// its wait_for_exit and output are answered from the receipt. A
		// cancel has nothing to kill: the answer stands.
		cl.b.addReplayTerminal(resp.TerminalId, replayTerminal(createKey, replayed))
		return resp, nil
	case err == nil:
		// Also on a replay of a command still running here: the same digest
		// means the same request (and the same files to verify), so the
		// terminal is this session's.
		cl.b.addTerminalIfAbsent(resp.TerminalId, &terminal{createKey: createKey, expect: verify, deadline: cl.Deadline})
	}
	if err == nil && ctx.Err() != nil {
		cl.kill(resp.TerminalId, "terminal/create cancelled by the agent")
		return acp.CreateTerminalResponse{}, acp.NewRequestCancelled(map[string]any{"terminalId": resp.TerminalId})
	}
	return resp, err
}

// Shell is what runs a terminal/create command that has no args: ACP
// agents send a whole shell line in command ("echo ran > ran.txt && id
// -u"), so it runs as Shell -c COMMAND inside the computer, as the grant's
// user, like any other command.
const Shell = "/bin/sh"

// argv is the command line of a terminal/create: command and args exec'd
// as they are, or, with no args, the command as a shell line.
func argv(command string, args []string) []string {
	if len(args) == 0 {
		return []string{Shell, "-c", command}
	}
	return append([]string{command}, args...)
}

// execArgs maps a terminal/create request onto exec_start args: no cwd is
// the tuple's root; the env is merged by the receiver over the
// computer's default environment (PATH, HOME, LANG).
func (cl *call) execArgs(p acp.CreateTerminalRequest) (*wire.ExecStartArgs, map[string]string, error) {
	if p.Command == "" {
		return nil, nil, cl.invalid("command is empty")
	}
	cwd := "."
	if p.Cwd != nil {
		var err error
		if cwd, err = cl.path(*p.Cwd); err != nil {
			return nil, nil, err
		}
	}
	env := make(map[string]string, len(p.Env))
	for _, e := range p.Env {
		if _, dup := env[e.Name]; dup {
			return nil, nil, cl.invalid("env names %q twice", e.Name)
		}
		env[e.Name] = e.Value
	}
	v, _, err := acpmeta.VerifyFromMeta(p.Meta)
	if err != nil {
		return nil, nil, cl.invalid("%v", err)
	}
	paths := make([]string, 0, len(v.Files))
	for p := range v.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var limit *int64
	if p.OutputByteLimit != nil {
		if *p.OutputByteLimit < 0 {
			return nil, nil, cl.invalid("outputByteLimit is negative")
		}
		limit = new(int64(*p.OutputByteLimit))
	}
	return &wire.ExecStartArgs{Argv: argv(p.Command, p.Args), Cwd: cwd, Env: env,
		OutputLimit: limit, HashAfterExit: paths}, v.Files, nil
}

func (cl *call) invalid(format string, args ...any) error {
	cl.Refuse(errcode.CodeInvalid)
	return acperr.NewError(errcode.CodeInvalid, format, args...)
}

// terminalOf returns a terminal this binding started and has not
// released; a terminal of another session, of an earlier custodian
// process, or released, is not_found and nothing is forwarded.
func (cl *call) terminalOf(id string) (*terminal, error) {
	t, err := cl.knownTerminal(id)
	if err != nil {
		return nil, err
	}
	if released, _ := t.releaseState(); released {
		cl.Refuse(errcode.CodeNotFound)
		return nil, acperr.NewError(errcode.CodeNotFound, "terminal %q was released by session %s", id, cl.b.ID)
	}
	return t, nil
}

// knownTerminal returns a terminal this binding started, released or not
// (kill and release answer a released one without error).
func (cl *call) knownTerminal(id string) (*terminal, error) {
	t, ok := cl.b.terminal(id)
	if !ok {
		cl.Refuse(errcode.CodeNotFound)
		return nil, acperr.NewError(errcode.CodeNotFound, "terminal %q was not started by session %s", id, cl.b.ID)
	}
	return t, nil
}

// WaitForTerminalExit serves terminal/wait_for_exit and completes the
// exec's receipt from the exit status and the after-exit digests, even if
// the agent cancelled the wait after the answer arrived. If the
// agent cancels the wait ($/cancel_request), the child is killed through
// the receiver.
func (h *client) WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalWaitForExit, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.WaitForTerminalExitResponse{}, err
	}
	t, err := cl.terminalOf(p.TerminalId)
	if err != nil {
		return acp.WaitForTerminalExitResponse{}, err
	}
	if f := t.finalOutput(); f != nil { // the exit is known already: nothing to ask
		cl.answeredFromFinal(len(f.Output))
		return acp.WaitForTerminalExitResponse{ExitCode: f.Exit.ExitCode, Signal: signalPtr(f.Exit.Signal)}, nil
	}
	if t.replayOf != nil { // a replay whose receipt has no output: its exit, if recorded
		if e := t.replayOf.Exit; e != nil {
			cl.answeredFromFinal(0)
			return acp.WaitForTerminalExitResponse{ExitCode: e.ExitCode, Signal: signalPtr(e.Signal)}, nil
		}
		return acp.WaitForTerminalExitResponse{}, cl.replayLacks(t, p.TerminalId, "exit")
	}
	cl.waitPastCommandEnd(t)
	var res wire.ExecWaitResult
	t.beginReleasingWait()
	err = cl.readOnlyWith(ctx, func(callCtx context.Context, conn ReceiverConn) error {
		return cl.waitReleasing(ctx, callCtx, conn, p.TerminalId, &res)
	}, exitAnnotate(&res.Exit))
	if err == nil {
		cl.step(ctx, "exit-observed")
		if res.Output != nil {
			t.keepFinal(&wire.ExecOutputResult{Output: *res.Output, Truncated: res.Truncated, Exit: &res.Exit}, res.Released)
		}
		cl.c.recordExit(t, res.Exit, res.FileSHA256, "")
	}
	t.endReleasingWait()
	if ctx.Err() != nil { // cancelled by the agent: the command was killed (waitReleasing)
		return acp.WaitForTerminalExitResponse{}, acp.NewRequestCancelled(map[string]any{"terminalId": p.TerminalId})
	}
	if err != nil {
		return acp.WaitForTerminalExitResponse{}, err
	}
	return acp.WaitForTerminalExitResponse{ExitCode: res.Exit.ExitCode, Signal: signalPtr(res.Exit.Signal)}, nil
}

// waitReleasing sends exec_wait with release: the answer carries the
// exit, the digests and the final output, and the receiver forgets the
// terminal with it, so terminal/release later sends nothing (one wire
// exchange fewer per command). Such an answer must never be abandoned,
// or the exit is lost with the terminal: the request does not follow the
// agent's ctx but callCtx (the call's deadline). When the agent cancels
// while it waits, the command is killed through the receiver, as before,
// and the answer the kill brings is still taken (at most killTimeout
// more), so the exit is recorded and the terminal's later output, kill
// and release are answered from it.
func (cl *call) waitReleasing(agentCtx, callCtx context.Context, conn ReceiverConn, id string, res *wire.ExecWaitResult) error {
	callCtx, cancel := context.WithCancel(context.WithoutCancel(callCtx))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- conn.CallFenced(callCtx, wire.OpExecWait, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline,
			&wire.TerminalArgs{TerminalID: id, Release: true}, res)
	}()
	select {
	case err := <-done:
		return err
	case <-agentCtx.Done():
	}
	cl.kill(id, "terminal/wait_for_exit cancelled by the agent")
	select {
	case err := <-done:
		return err
	case <-time.After(killTimeout):
		cancel() // the answer is lost: the receipt says the exit was not observed
		return <-done
	}
}

// keepFinal keeps the command's final output; goneRemote says the
// receiver forgot the terminal with the answer that carried it.
func (t *terminal) keepFinal(f *wire.ExecOutputResult, goneRemote bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.final == nil {
		t.final = f
	}
	t.goneRemote = t.goneRemote || goneRemote
}

// finalOutput returns the final output kept, or nil.
func (t *terminal) finalOutput() *wire.ExecOutputResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.final
}

// releasedRemotely reports whether the receiver forgot the terminal with
// its final wait.
func (t *terminal) releasedRemotely() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.goneRemote
}

// outcomeFromFinal is the audit outcome of a call answered from the final
// output the custodian kept: nothing was sent.
const outcomeFromFinal = "from_final_answer"

// answeredFromFinal audits a call answered from the kept final output.
func (cl *call) answeredFromFinal(outputBytes int) {
	rec := cl.record(audit.KindResult)
	rec.Outcome, rec.Code = outcomeFromFinal, codeNotSent
	rec.Sizes = map[string]int64{"output": int64(outputBytes)}
	cl.c.audit(rec)
}

// TerminalOutput serves terminal/output (read-only). The output goes to
// the agent; the audit log keeps only its size and digest. An exit it
// shows completes the exec's receipt (recordOutputExit).
func (h *client) TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodTerminalOutput, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.TerminalOutputResponse{}, err
	}
	t, err := cl.terminalOf(p.TerminalId)
	if err != nil {
		return acp.TerminalOutputResponse{}, err
	}
	if f := t.finalOutput(); f != nil { // final: the answer that carried it is the answer
		cl.answeredFromFinal(len(f.Output))
		return outputResponse(f), nil
	}
	if t.replayOf != nil {
		return acp.TerminalOutputResponse{}, cl.replayLacks(t, p.TerminalId, "output")
	}
	var res wire.ExecOutputResult
	idle, waiting := t.releasingWaitIdle()
	err = cl.readOnly(ctx, wire.OpExecOutput, &wire.TerminalArgs{TerminalID: p.TerminalId}, &res, func(r *audit.Record) {
		r.Sizes = map[string]int64{"output": int64(len(res.Output))}
		r.Digests = map[string]string{"output": sha256Hex([]byte(res.Output))}
	})
	if err != nil && waiting {
		if f := cl.finalAfterWait(ctx, t, idle, err); f != nil {
			cl.answeredFromFinal(len(f.Output))
			return outputResponse(f), nil
		}
	}
	if err != nil {
		return acp.TerminalOutputResponse{}, err
	}
	if res.Exit != nil {
		cl.step(ctx, "exit-observed")
		t.keepFinal(&res, false)
		cl.recordOutputExit(ctx, t, p.TerminalId, &res)
	}
	return outputResponse(&res), nil
}

// finalAfterWait returns t's final output when err is the receiver's
// not_found for a terminal whose releasing wait was in flight (idle
// closes when it ends): that wait made the receiver forget the terminal,
// and its answer carries the final output. It waits for that answer,
// bounded by ctx; nil otherwise.
func (cl *call) finalAfterWait(ctx context.Context, t *terminal, idle <-chan struct{}, err error) *wire.ExecOutputResult {
	if !goneAtWait(ctx, idle, err) {
		return nil
	}
	return t.finalOutput()
}

// outputResponse is terminal/output's answer from the receiver's.
func outputResponse(res *wire.ExecOutputResult) acp.TerminalOutputResponse {
	out := acp.TerminalOutputResponse{Output: res.Output, Truncated: res.Truncated}
	if res.Exit != nil {
		out.ExitStatus = &acp.TerminalExitStatus{ExitCode: res.Exit.ExitCode, Signal: signalPtr(res.Exit.Signal)}
	}
	return out
}

// exitGrace is how long after a command's own deadline a wait the
// custodian tagged still waits: the receiver kills the command at its
// deadline, then reaps it, drains its output and empties its cgroup (at
// most 10 s) before the exit is final.
const exitGrace = 15 * time.Second

// waitPastCommandEnd lets a plain agent's wait_for_exit observe the end of
// a command its own deadline kills. Both deadlines come from the same
// command budget, so without this the wait would end at the very moment
// the command is killed and answer fate_unknown instead of the exit. A
// tether agent's wait keeps the deadline of its own tag.
func (cl *call) waitPastCommandEnd(t *terminal) {
	if cl.TaggedBy != TaggedByCustodian || t.deadline.IsZero() {
		return
	}
	if end := t.deadline.Add(exitGrace); end.After(cl.Deadline) {
		cl.Deadline = end
	}
}

func exitAnnotate(e *wire.ExitStatus) func(*audit.Record) {
	return func(r *audit.Record) { r.ExitCode, r.Signal = e.ExitCode, e.Signal }
}

func signalPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// killTimeout bounds the kill sent when the agent cancels.
const killTimeout = 10 * time.Second
