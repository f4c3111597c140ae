package shared

import (
	"context"
	"errors"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/receiver/wire"
)

// TerminalRun is one command run to its end on the host's ACP connection
// (ACPClient.RunTerminal). Every request goes out with exactly the `_meta`
// given here: the plugin builds each step's op tag.
type TerminalRun struct {
	// Create is the terminal/create request, its Meta included.
	Create acp.CreateTerminalRequest
	// Deadline ends the wait: at that time the host kills the command.
	Deadline time.Time
	// CleanupTimeout bounds kill, output and release together, from the
	// moment the wait ends.
	CleanupTimeout time.Duration
	// The `_meta` of terminal/wait_for_exit, kill, output and release.
	WaitMeta, KillMeta, OutputMeta, ReleaseMeta map[string]any
}

// Step is how one ACP request of a terminal run went.
type Step struct {
	// Sent: the request went out on the ACP connection.
	Sent bool
	// Err is the client's answer (*acp.RequestError) or the loss of the
	// connection (wraps ErrTransport); nil if the step succeeded or was not
	// sent.
	Err error
}

// TerminalSteps are the five requests of a run, each reported.
type TerminalSteps struct {
	Create, Wait, Kill, Output, Release Step
}

// Errors returns every step's error, in order, skipping nils.
func (s TerminalSteps) Errors() []error {
	var out []error
	for _, st := range []Step{s.Create, s.Wait, s.Kill, s.Output, s.Release} {
		if st.Err != nil {
			out = append(out, st.Err)
		}
	}
	return out
}

// TerminalResult is what RunTerminal reports.
type TerminalResult struct {
	// TerminalID is set once terminal/create succeeded.
	TerminalID string
	Steps      TerminalSteps
	// Exit is the exit status from wait_for_exit, else from the output.
	Exit      *acp.TerminalExitStatus
	Output    string
	Truncated bool
	// TimedOut: the deadline ended the wait. Cancelled: the caller's
	// cancel (or the plugin going away) ended it, or came before
	// terminal/create, which was then not sent. Either way no command was
	// left running: kill was sent if one had started.
	TimedOut, Cancelled bool
}

// TerminalCalls is the part of an ACP agent-side connection RunTerminal
// drives; *acp.AgentSideConnection has it. Implementations report a lost
// connection by wrapping ErrTransport.
type TerminalCalls interface {
	CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error)
	WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error)
	KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error)
	TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error)
	ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error)
}

// errStopped is the cause of a wait ended by the caller's cancel.
var errStopped = errors.New("the tool call's caller cancelled")

// RunTerminal is the host's side of ACPClient.RunTerminal: terminal/create
// under ctx, then terminal/wait_for_exit until r.Deadline, ctx's end or
// stop's end (stop may be nil: the tool call's caller, see
// plugin/host), then terminal/kill if the wait was ended, terminal/output
// and terminal/release. Kill, output and release run under their own
// r.CleanupTimeout even when ctx has ended, so a command that started is
// never left running or unreleased because its caller or the plugin went
// away. If stop has ended before anything is sent, nothing is sent.
func RunTerminal(ctx context.Context, t TerminalCalls, r TerminalRun, stop context.Context) TerminalResult {
	var res TerminalResult
	if stop != nil && stop.Err() != nil {
		res.Cancelled = true
		return res
	}
	created, err := t.CreateTerminal(ctx, r.Create)
	res.Steps.Create = Step{Sent: true, Err: err}
	if err != nil {
		return res
	}
	res.TerminalID = created.TerminalId
	refused := waitExit(ctx, t, r, stop, &res)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.CleanupTimeout)
	defer cancel()
	sid, tid := r.Create.SessionId, res.TerminalID
	if !refused && (res.TimedOut || res.Cancelled) {
		_, err := t.KillTerminal(cctx, acp.KillTerminalRequest{SessionId: sid, TerminalId: tid, Meta: r.KillMeta})
		res.Steps.Kill = Step{Sent: true, Err: err}
	}
	if !refused && res.Steps.Kill.Err == nil {
		out, err := t.TerminalOutput(cctx, acp.TerminalOutputRequest{SessionId: sid, TerminalId: tid, Meta: r.OutputMeta})
		res.Steps.Output = Step{Sent: true, Err: err}
		if err == nil {
			res.Output, res.Truncated = out.Output, out.Truncated
			if res.Exit == nil {
				res.Exit = out.ExitStatus
			}
		}
	}
	_, err = t.ReleaseTerminal(cctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: tid, Meta: r.ReleaseMeta})
	res.Steps.Release = Step{Sent: true, Err: err}
	return res
}

// waitExit sends terminal/wait_for_exit bounded by r.Deadline, ctx and
// stop, and records how the wait ended. It reports whether the client
// refused the wait (its error is then in res.Steps.Wait).
func waitExit(ctx context.Context, t TerminalCalls, r TerminalRun, stop context.Context, res *TerminalResult) (refused bool) {
	wctx, cancelDeadline := context.WithDeadline(ctx, r.Deadline)
	defer cancelDeadline()
	wctx, cancel := context.WithCancelCause(wctx)
	defer cancel(nil)
	if stop != nil {
		defer context.AfterFunc(stop, func() { cancel(errStopped) })()
	}
	var exit acp.WaitForTerminalExitResponse
	var err error
	if wctx.Err() == nil {
		exit, err = t.WaitForTerminalExit(wctx, acp.WaitForTerminalExitRequest{SessionId: r.Create.SessionId,
			TerminalId: res.TerminalID, Meta: r.WaitMeta})
		res.Steps.Wait.Sent = true
	}
	switch {
	case res.Steps.Wait.Sent && err == nil:
		res.Exit = &acp.TerminalExitStatus{ExitCode: exit.ExitCode, Signal: exit.Signal}
		return false
	case wctx.Err() == nil && !lateWait(err): // sent, and the client answered with an error
		res.Steps.Wait.Err = err
		return true
	case (errors.Is(context.Cause(wctx), context.DeadlineExceeded) || wctx.Err() == nil) && ctx.Err() == nil:
		res.TimedOut = true
	default:
		res.Cancelled = true
	}
	return false
}

// lateWait reports whether the client refused the wait because its
// deadline, the run's, had passed when the request arrived: the deadline
// ended the wait as surely as this side's timer would have a moment
// later, so the run is timed out (kill, output, release), not refused.
func lateWait(err error) bool {
	code, ok := acpmeta.CodeOf(err)
	return ok && code == wire.CodeTimeout
}
