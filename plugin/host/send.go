package host

import (
	"context"
	"errors"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
	"github.com/tetherdev/tether/plugin/toolplan"
)

// The fs requests of a plan. Each is sent only while the caller has not
// cancelled; once sent it is not abandoned for a cancel (a write in flight
// completes: it is atomic and keyed), only for the plan's deadline.

func (x *toolCall) sid() acp.SessionId { return acp.SessionId(x.plan.SessionID) }

func (x *toolCall) cancelled(ctx context.Context) error {
	return &CancelledError{Tool: x.tool, Cause: context.Cause(ctx)}
}

// requestContext is what a request is sent under: ctx's values, not its
// cancel, and the plan's deadline.
func (x *toolCall) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), x.plan.Deadline)
}

// read sends fs/read_text_file.
func (x *toolCall) read(ctx context.Context, path string, line, limit *int, meta map[string]any) (string, error) {
	if ctx.Err() != nil {
		return "", x.cancelled(ctx)
	}
	rctx, cancel := x.requestContext(ctx)
	defer cancel()
	resp, err := x.c.asc.ReadTextFile(rctx, acp.ReadTextFileRequest{SessionId: x.sid(), Path: path, Line: line, Limit: limit, Meta: meta})
	if err != nil {
		return "", x.failed(ctx, "fs/read_text_file", err)
	}
	return resp.Content, nil
}

// write sends fs/write_text_file.
func (x *toolCall) write(ctx context.Context, path, content string, meta map[string]any) error {
	if ctx.Err() != nil {
		return x.cancelled(ctx)
	}
	rctx, cancel := x.requestContext(ctx)
	defer cancel()
	_, err := x.c.asc.WriteTextFile(rctx, acp.WriteTextFileRequest{SessionId: x.sid(), Path: path, Content: content, Meta: meta})
	if err != nil {
		return x.failed(ctx, "fs/write_text_file", err)
	}
	return nil
}

// edit runs an EditStep: the read, then (unless the caller cancelled) the
// write of the edited content, which the client refuses if the file
// changed since the read (`tether/expect`).
func (x *toolCall) edit(ctx context.Context, st contract.EditStep) (EditResult, error) {
	content, err := x.read(ctx, st.Path, nil, nil, st.ReadMeta.ACP())
	if err != nil {
		return EditResult{}, err
	}
	updated, prev, err := toolplan.ApplyEdit(st.Path, content, st.OldText, st.NewText)
	if err != nil {
		return EditResult{}, err
	}
	meta := acpmeta.MergeMeta(st.WriteMeta.ACP(), acpmeta.Expect{SHA256: prev}.Meta())
	if err := x.write(ctx, st.Path, updated, meta); err != nil {
		return EditResult{}, err
	}
	return EditResult{OpKey: x.plan.OpKey, Path: st.Path, PreviousSHA256: prev, SHA256: toolplan.SHA256Hex(updated)}, nil
}

// failed turns a request's error into the tool's: the plugin is told first
// if it must fence.
func (x *toolCall) failed(ctx context.Context, request string, err error) error {
	err = x.c.transport(err)
	var failures []contract.Failure
	if f, ok := x.failure(request, err); ok {
		failures = append(failures, f)
	}
	return x.fenceFailures(ctx, failures, toolError(err))
}

// stepError is a terminal run that failed at its kill or its release,
// after the command had started.
type stepError struct {
	step       string // "terminal/kill" or "terminal/release"
	terminalID string
	err        error // the client's error or the lost connection
}

func (e *stepError) Error() string {
	return fmt.Sprintf("run_command: %s of terminal %s failed: %s", e.step, e.terminalID, contract.PeerMessage(e.err))
}

// Unwrap returns the step's error, so its tether code reads through.
func (e *stepError) Unwrap() error { return e.err }

// toolError turns a request's failure into a *errcode.Error with a code from
// the closed set and the client's own message (contract.PeerMessage), never
// its whole JSON-RPC error as text.
func toolError(err error) error {
	var we *errcode.Error
	if errors.As(err, &we) {
		return we
	}
	msg := contract.PeerMessage(err)
	var se *stepError
	if errors.As(err, &se) {
		msg = se.Error()
	}
	if code, ok := acperr.CodeOf(err); ok {
		return &errcode.Error{Code: code, Message: msg}
	}
	var re *acp.RequestError
	switch {
	case errors.Is(err, contract.ErrTransport):
		return errcode.Errorf(errcode.CodeFateUnknown, "%s", msg)
	case errors.As(err, &re):
		return errcode.Errorf(jsonRPCCode(re.Code), "%s", msg)
	case errors.Is(err, context.DeadlineExceeded):
		return errcode.Errorf(errcode.CodeTimeout, "%v", err)
	}
	return errcode.Errorf(errcode.CodeInternal, "%v", err)
}

// jsonRPCCode maps a JSON-RPC error without a tether code.
func jsonRPCCode(c int) errcode.Code {
	switch c {
	case -32602, -32600, -32700:
		return errcode.CodeInvalid
	case -32601:
		return errcode.CodeUnavailable
	case -32800:
		return errcode.CodeTimeout
	}
	return errcode.CodeInternal
}
