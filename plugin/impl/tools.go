package impl

import (
	"context"
	"errors"
	"fmt"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/plugin/binding"
	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/plugin/shared"
	"github.com/tetherdev/tether/plugin/tools"
	"github.com/tetherdev/tether/receiver/wire"
)

// call is one tool invocation: its grant, its ctx (deadline = min(timeout,
// lease end)) and the tools.Call whose Backend fences on binding errors.
type call struct {
	grant binding.Grant
	tc    tools.Call
}

// begin authorizes the tool for the session on the connection and prepares
// the call. The returned cancel must be called.
func (s *Server) begin(ctx context.Context, tc *pb.ToolContext) (context.Context, context.CancelFunc, call, error) {
	c, err := s.conn(tc.GetConnId())
	if err != nil {
		return ctx, func() {}, call{}, err
	}
	g, err := s.table.Authorize(c.id, tc.GetSessionId())
	if err != nil {
		return ctx, func() {}, call{}, err
	}
	key, err := tools.OpKey(tc.GetOpKey())
	if err != nil {
		return ctx, func() {}, call{}, err
	}
	if !shared.ValidCallID(tc.GetCallId()) {
		return ctx, func() {}, call{}, wire.Errorf(wire.CodeInvalid, "call_id must be 0-64 of [A-Za-z0-9_-]")
	}
	timeout := DefaultToolTimeout
	switch t := time.Duration(tc.GetTimeoutMs()) * time.Millisecond; {
	case t < 0 || t > MaxToolTimeout:
		return ctx, func() {}, call{}, wire.Errorf(wire.CodeInvalid, "timeout_ms must be 0..%d", MaxToolTimeout.Milliseconds())
	case t > 0:
		timeout = t
	}
	deadline := s.now().Add(timeout)
	if g.NotAfter.Before(deadline) {
		deadline = g.NotAfter
	}
	cctx, cancel := context.WithDeadline(shared.WithCallID(ctx, tc.GetCallId()), deadline)
	backend := &fencing{ACPClient: c.client, fence: func(code wire.Code, msg string) { s.table.Fence(g, code, msg) }}
	return cctx, cancel, call{grant: g, tc: tools.Call{Backend: backend, SessionID: g.SessionID, Root: g.Tuple.Root,
		TupleSHA256: g.TupleSHA256, OpKey: key, Deadline: deadline}}, nil
}

// toolError turns any tool failure into a *wire.Error with a code from the
// closed set and the peer's own message (shared.PeerMessage), never its
// whole JSON-RPC error as text; a cancelled call stays a cancellation
// (shared.ErrCancelled or the context's error).
func toolError(err error) error {
	if err == nil {
		return nil
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return we
	}
	msg := shared.PeerMessage(err)
	var se *tools.StepError
	if errors.As(err, &se) {
		msg = se.Error()
	}
	if code, ok := acpmeta.CodeOf(err); ok {
		return &wire.Error{Code: code, Message: msg}
	}
	var re *acp.RequestError
	switch {
	case errors.Is(err, shared.ErrTransport):
		return wire.Errorf(wire.CodeFateUnknown, "%s", msg)
	case errors.As(err, &re):
		return wire.Errorf(jsonRPCCode(re.Code), "%s", msg)
	case errors.Is(err, shared.ErrCancelled), errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, context.DeadlineExceeded):
		return wire.Errorf(wire.CodeTimeout, "%v", err)
	}
	return wire.Errorf(wire.CodeInternal, "%v", err)
}

// jsonRPCCode maps a JSON-RPC error without a tether code.
func jsonRPCCode(c int) wire.Code {
	switch c {
	case -32602, -32600, -32700:
		return wire.CodeInvalid
	case -32601:
		return wire.CodeUnavailable
	case -32800:
		return wire.CodeTimeout
	}
	return wire.CodeInternal
}

// bindingCodes are the client's answers that mean the binding itself is in
// doubt: they fence it (rule 6).
var bindingCodes = map[wire.Code]bool{
	wire.CodeTupleMismatch: true, wire.CodeNotAdmitted: true, wire.CodeLeaseExpired: true,
	wire.CodeFenced: true, wire.CodeFateUnknown: true, wire.CodeUnavailable: true,
}

// fencing is the tools' Backend: the connection's client, fencing the
// binding when a call fails with a binding code or loses the transport.
type fencing struct {
	shared.ACPClient
	fence func(code wire.Code, msg string)
}

func (f *fencing) check(err error) error {
	if err == nil {
		return nil
	}
	if code, ok := acpmeta.CodeOf(err); ok {
		if bindingCodes[code] {
			f.fence(code, fmt.Sprintf("client answered %s: %s", code, shared.PeerMessage(err)))
		}
		return err
	}
	if errors.Is(err, shared.ErrTransport) {
		f.fence(wire.CodeFateUnknown, err.Error())
	}
	return err
}

func (f *fencing) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	r, err := f.ACPClient.ReadTextFile(ctx, p)
	return r, f.check(err)
}

func (f *fencing) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	r, err := f.ACPClient.WriteTextFile(ctx, p)
	return r, f.check(err)
}

// RunTerminal checks every step of the run: a binding error from any of
// them fences, as it would from a call of its own.
func (f *fencing) RunTerminal(ctx context.Context, r shared.TerminalRun) (shared.TerminalResult, error) {
	res, err := f.ACPClient.RunTerminal(ctx, r)
	if err != nil {
		return res, f.check(err)
	}
	for _, serr := range res.Steps.Errors() {
		_ = f.check(serr)
	}
	return res, nil
}

// ReadTextFile implements shared.Plugin.
func (s *Server) ReadTextFile(ctx context.Context, req *pb.ReadTextFileToolRequest) (*pb.ReadTextFileToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	r, err := tools.ReadTextFile(ctx, c.tc, req.GetPath(), int(req.GetLine()), int(req.GetLimit()))
	if err != nil {
		return nil, toolError(err)
	}
	return &pb.ReadTextFileToolResponse{OpKey: c.tc.OpKey, Path: r.Path, Content: r.Content}, nil
}

// WriteTextFile implements shared.Plugin.
func (s *Server) WriteTextFile(ctx context.Context, req *pb.WriteTextFileToolRequest) (*pb.WriteTextFileToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	r, err := tools.WriteTextFile(ctx, c.tc, req.GetPath(), req.GetContent())
	if err != nil {
		return nil, toolError(err)
	}
	return &pb.WriteTextFileToolResponse{OpKey: c.tc.OpKey, Path: r.Path, Bytes: int64(r.Bytes)}, nil
}

// EditTextFile implements shared.Plugin.
func (s *Server) EditTextFile(ctx context.Context, req *pb.EditTextFileToolRequest) (*pb.EditTextFileToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	r, err := tools.EditTextFile(ctx, c.tc, req.GetPath(), req.GetOldText(), req.GetNewText())
	if err != nil {
		return nil, toolError(err)
	}
	return &pb.EditTextFileToolResponse{OpKey: c.tc.OpKey, Path: r.Path, PreviousSha256: r.PreviousSHA256, Sha256: r.SHA256}, nil
}

// ListDirectory implements shared.Plugin.
func (s *Server) ListDirectory(ctx context.Context, req *pb.ListDirectoryToolRequest) (*pb.ListDirectoryToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	abs, entries, err := tools.ListDirectory(ctx, c.tc, req.GetPath())
	if err != nil {
		return nil, toolError(err)
	}
	out := &pb.ListDirectoryToolResponse{OpKey: c.tc.OpKey, Path: abs}
	for _, e := range entries {
		out.Entries = append(out.Entries, &pb.DirEntry{Name: e.Name, Type: e.Type})
	}
	return out, nil
}

// RunCommand implements shared.Plugin.
func (s *Server) RunCommand(ctx context.Context, req *pb.RunCommandToolRequest) (*pb.RunCommandToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	cmd := tools.Command{Command: req.GetCommand(), Args: req.GetArgs(), Cwd: req.GetCwd(),
		OutputLimit: int(req.GetOutputByteLimit()), Verify: req.GetVerify()}
	for _, e := range req.GetEnv() {
		cmd.Env = append(cmd.Env, acp.EnvVariable{Name: e.GetName(), Value: e.GetValue()})
	}
	r, err := tools.RunCommand(ctx, c.tc, cmd)
	if err != nil {
		return nil, toolError(err)
	}
	exit := &pb.AcpExitStatus{Signal: r.Signal}
	if r.ExitCode != nil {
		v := int32(*r.ExitCode)
		exit.ExitCode = &v
	}
	return &pb.RunCommandToolResponse{OpKey: c.tc.OpKey, TerminalId: r.TerminalID, Output: r.Output,
		Truncated: r.Truncated, Exit: exit, TimedOut: r.TimedOut, Cancelled: r.Cancelled}, nil
}

// Glob implements shared.Plugin: the binding is checked before and after,
// and a binding lost in between fails the call.
func (s *Server) Glob(ctx context.Context, req *pb.GlobToolRequest) (*pb.GlobToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	ms, err := tools.Glob(ctx, c.tc, req.GetPattern(), req.GetDir())
	if err == nil {
		err = s.table.Check(c.grant)
	}
	if err != nil {
		return nil, toolError(err)
	}
	return &pb.GlobToolResponse{OpKey: c.tc.OpKey, Matches: ms}, nil
}

// Grep implements shared.Plugin with the same before/after binding check.
func (s *Server) Grep(ctx context.Context, req *pb.GrepToolRequest) (*pb.GrepToolResponse, error) {
	ctx, cancel, c, err := s.begin(ctx, req.GetCtx())
	defer cancel()
	if err != nil {
		return nil, err
	}
	ms, err := tools.Grep(ctx, c.tc, req.GetPattern(), req.GetDir(), tools.GrepOptions{Fixed: req.GetFixed(), IgnoreCase: req.GetIgnoreCase()})
	if err == nil {
		err = s.table.Check(c.grant)
	}
	if err != nil {
		return nil, toolError(err)
	}
	out := &pb.GrepToolResponse{OpKey: c.tc.OpKey}
	for _, m := range ms {
		out.Matches = append(out.Matches, &pb.GrepMatch{Path: m.Path, Line: m.Line, Text: m.Text})
	}
	return out, nil
}
