package host

import (
	"context"
	"encoding/json"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/shared"
)

// ascClient is the host's ACPClient: the closed set of calls on the ACP
// connection. Once the connection is done, failures wrap ErrTransport.
// Work for a tool call (named by the call id in ctx) is refused once the
// call is over, and a running command's wait ends when its caller cancels.
type ascClient struct {
	asc   *acp.AgentSideConnection
	calls *callTable
}

var (
	_ shared.ACPClient     = &ascClient{}
	_ shared.TerminalCalls = &ascClient{}
)

func (a *ascClient) wrap(err error) error {
	if err == nil {
		return nil
	}
	select {
	case <-a.asc.Done():
		return fmt.Errorf("%w: ACP connection closed: %v", shared.ErrTransport, err)
	default:
		return err
	}
}

// startWork enters the tool call ctx names; a cancelled call sends
// nothing more (ErrCancelled).
func (a *ascClient) startWork(ctx context.Context) (func(), error) {
	caller, leave, err := a.calls.enter(shared.CallID(ctx))
	if err != nil {
		return nil, err
	}
	if caller != nil && caller.Err() != nil {
		leave()
		return nil, fmt.Errorf("%w: %v; nothing sent", shared.ErrCancelled, context.Cause(caller))
	}
	return leave, nil
}

// ReadTextFile sends fs/read_text_file, unless its tool call is cancelled.
func (a *ascClient) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	leave, err := a.startWork(ctx)
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	defer leave()
	r, err := a.asc.ReadTextFile(ctx, p)
	return r, a.wrap(err)
}

// WriteTextFile sends fs/write_text_file, unless its tool call is
// cancelled. A write already sent is never abandoned for a cancel.
func (a *ascClient) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	leave, err := a.startWork(ctx)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	defer leave()
	r, err := a.asc.WriteTextFile(ctx, p)
	return r, a.wrap(err)
}

// RunTerminal runs the command to its end (shared.RunTerminal); the wait
// ends when the tool call's caller cancels.
func (a *ascClient) RunTerminal(ctx context.Context, r shared.TerminalRun) (shared.TerminalResult, error) {
	caller, leave, err := a.calls.enter(shared.CallID(ctx))
	if err != nil {
		return shared.TerminalResult{Cancelled: true}, nil
	}
	defer leave()
	return shared.RunTerminal(ctx, a, r, caller), nil
}

// Attach calls `_tether/attach`.
func (a *ascClient) Attach(ctx context.Context, p acpmeta.AttachRequest) (json.RawMessage, error) {
	raw, err := a.asc.CallExtension(ctx, acpmeta.MethodAttach, p)
	return raw, a.wrap(err)
}

// The terminal requests shared.RunTerminal sends.

func (a *ascClient) CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	r, err := a.asc.CreateTerminal(ctx, p)
	return r, a.wrap(err)
}

func (a *ascClient) TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	r, err := a.asc.TerminalOutput(ctx, p)
	return r, a.wrap(err)
}

func (a *ascClient) WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	r, err := a.asc.WaitForTerminalExit(ctx, p)
	return r, a.wrap(err)
}

func (a *ascClient) KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	r, err := a.asc.KillTerminal(ctx, p)
	return r, a.wrap(err)
}

func (a *ascClient) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	r, err := a.asc.ReleaseTerminal(ctx, p)
	return r, a.wrap(err)
}
