package host

import (
	"context"
	"errors"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// terminalSlack is how long past its clean-up a terminal run's create may
// still wait for the client.
const terminalSlack = 5 * time.Second

// step is how one request of a terminal run went.
type step struct {
	sent bool
	err  error // the client's answer, or the loss of the connection (wraps contract.ErrTransport)
}

// terminalRun is what a TerminalStep's run showed.
type terminalRun struct {
	terminalID                          string
	create, wait, kill, output, release step
	exit                                ExitStatus
	out                                 string
	truncated                           bool
	// timedOut: the deadline ended the wait. cancelled: the caller's
	// cancel ended it, or came before terminal/create, which was then not
	// sent. Either way no command was left running: kill was sent if one
	// had started.
	timedOut, cancelled bool
}

// errStopped is the cause of a wait ended by the caller's cancel.
var errStopped = errors.New("the tool call's caller cancelled")

// terminal runs st: terminal/create, then terminal/wait_for_exit until the
// plan's deadline or the caller's cancel (ctx), then terminal/kill if the
// wait was ended, terminal/output and terminal/release. Kill, output and
// release run under their own st.CleanupTimeout from the moment the wait
// ended, whatever became of ctx, so a command that started is never left
// running or unreleased. If ctx has ended before anything is sent, nothing
// is sent.
func (x *toolCall) terminal(ctx context.Context, st contract.TerminalStep) terminalRun {
	var r terminalRun
	if ctx.Err() != nil {
		r.cancelled = true
		return r
	}
	base, cancel := context.WithDeadline(context.WithoutCancel(ctx), x.plan.Deadline.Add(st.CleanupTimeout+terminalSlack))
	defer cancel()
	created, err := x.c.asc.CreateTerminal(base, x.createRequest(st))
	r.create = step{sent: true, err: x.c.transport(err)}
	if err != nil {
		return r
	}
	r.terminalID = created.TerminalId
	refused := x.waitExit(base, ctx, st, &r)
	cctx, ccancel := context.WithTimeout(base, st.CleanupTimeout)
	defer ccancel()
	tid := r.terminalID
	if !refused && (r.timedOut || r.cancelled) {
		_, err := x.c.asc.KillTerminal(cctx, acp.KillTerminalRequest{SessionId: x.sid(), TerminalId: tid, Meta: st.KillMeta.ACP()})
		r.kill = step{sent: true, err: x.c.transport(err)}
	}
	if !refused && r.kill.err == nil {
		x.readOutput(cctx, st, &r)
	}
	_, err = x.c.asc.ReleaseTerminal(cctx, acp.ReleaseTerminalRequest{SessionId: x.sid(), TerminalId: tid, Meta: st.ReleaseMeta.ACP()})
	r.release = step{sent: true, err: x.c.transport(err)}
	return r
}

func (x *toolCall) createRequest(st contract.TerminalStep) acp.CreateTerminalRequest {
	req := acp.CreateTerminalRequest{SessionId: x.sid(), Command: st.Command, Args: st.Args, Env: st.Env, Meta: st.CreateMeta.ACP()}
	if st.Cwd != "" {
		req.Cwd = &st.Cwd
	}
	if st.OutputLimit > 0 {
		req.OutputByteLimit = &st.OutputLimit
	}
	return req
}

// waitExit sends terminal/wait_for_exit bounded by the plan's deadline,
// base and the caller's stop, and records how the wait ended. It reports
// whether the client refused the wait (its error is then in r.wait).
func (x *toolCall) waitExit(base, stop context.Context, st contract.TerminalStep, r *terminalRun) (refused bool) {
	wctx, cancelDeadline := context.WithDeadline(base, x.plan.Deadline)
	defer cancelDeadline()
	wctx, cancel := context.WithCancelCause(wctx)
	defer cancel(nil)
	defer context.AfterFunc(stop, func() { cancel(errStopped) })()
	var exit acp.WaitForTerminalExitResponse
	var err error
	if wctx.Err() == nil {
		exit, err = x.c.asc.WaitForTerminalExit(wctx, acp.WaitForTerminalExitRequest{SessionId: x.sid(),
			TerminalId: r.terminalID, Meta: st.WaitMeta.ACP()})
		r.wait.sent = true
	}
	switch {
	case r.wait.sent && err == nil:
		r.exit = ExitStatus{ExitCode: exit.ExitCode, Signal: exit.Signal}
		return false
	case wctx.Err() == nil && !lateWait(err): // sent, and the client answered with an error
		r.wait.err = x.c.transport(err)
		return true
	case (errors.Is(context.Cause(wctx), context.DeadlineExceeded) || wctx.Err() == nil) && base.Err() == nil:
		r.timedOut = true
	default:
		r.cancelled = true
	}
	return false
}

// lateWait reports whether the client refused the wait because its
// deadline, the plan's, had passed when the request arrived: the deadline
// ended the wait as surely as this side's timer would have a moment
// later, so the run is timed out (kill, output, release), not refused.
func lateWait(err error) bool {
	code, ok := acperr.CodeOf(err)
	return ok && code == errcode.CodeTimeout
}

// readOutput sends terminal/output; the exit comes from it when the wait
// did not give one.
func (x *toolCall) readOutput(ctx context.Context, st contract.TerminalStep, r *terminalRun) {
	out, err := x.c.asc.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: x.sid(), TerminalId: r.terminalID, Meta: st.OutputMeta.ACP()})
	r.output = step{sent: true, err: x.c.transport(err)}
	if err != nil {
		return
	}
	r.out, r.truncated = out.Output, out.Truncated
	if r.exit.ExitCode == nil && r.exit.Signal == nil && out.ExitStatus != nil {
		r.exit = ExitStatus{ExitCode: out.ExitStatus.ExitCode, Signal: out.ExitStatus.Signal}
	}
}

// settle reports the run's binding errors to the plugin and returns the
// run's own error: nothing started, the client refused create, wait or
// output, or the kill or release failed (a *stepError: never a success).
func (x *toolCall) settle(ctx context.Context, r terminalRun) error {
	var failures []contract.Failure
	for _, s := range []struct {
		name string
		step step
	}{{"terminal/create", r.create}, {"terminal/wait_for_exit", r.wait}, {"terminal/kill", r.kill},
		{"terminal/output", r.output}, {"terminal/release", r.release}} {
		if f, ok := x.failure(s.name, s.step.err); ok {
			failures = append(failures, f)
		}
	}
	var err error
	switch {
	case !r.create.sent:
		return x.cancelled(ctx) // before terminal/create: nothing was started
	case r.create.err != nil:
		err = r.create.err
	case r.wait.err != nil: // the client refused the wait; the terminal was released
		err = r.wait.err
	case r.kill.err != nil:
		err = &stepError{step: "terminal/kill", terminalID: r.terminalID, err: r.kill.err}
	case r.output.err != nil:
		err = r.output.err
	case r.release.err != nil:
		err = &stepError{step: "terminal/release", terminalID: r.terminalID, err: r.release.err}
	}
	if err != nil {
		err = toolError(err)
	}
	return x.fenceFailures(ctx, failures, err)
}

// commandResult is run_command's result from a settled run; a cancelled
// one comes back together with a *CancelledError holding it.
func (x *toolCall) commandResult(ctx context.Context, r terminalRun) (CommandResult, error) {
	res := CommandResult{OpKey: x.plan.OpKey, TerminalID: r.terminalID, Output: r.out, Truncated: r.truncated,
		Exit: r.exit, TimedOut: r.timedOut, Cancelled: r.cancelled}
	if err := x.settle(ctx, r); err != nil {
		return CommandResult{}, err
	}
	if r.cancelled {
		return res, &CancelledError{Tool: x.tool, Cause: context.Cause(ctx), Run: &res}
	}
	return res, nil
}

// shellRun is a shell tool's run (list_directory, glob, grep), settled:
// a cancelled one is a *CancelledError once its command was killed and
// released.
func (x *toolCall) shellRun(ctx context.Context, r terminalRun) (toolplan.ShellRun, error) {
	if err := x.settle(ctx, r); err != nil {
		return toolplan.ShellRun{}, err
	}
	if r.cancelled {
		return toolplan.ShellRun{}, x.cancelled(ctx)
	}
	return toolplan.ShellRun{Output: r.out, Truncated: r.truncated, TimedOut: r.timedOut,
		ExitCode: r.exit.ExitCode, Signal: r.exit.Signal}, nil
}
