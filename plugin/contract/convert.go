package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// The conversions between the Go contract and plugin/proto, used by the
// two adapters only.

var methods = map[Method]pb.SessionMethod{
	MethodNew:  pb.SessionMethod_SESSION_METHOD_NEW,
	MethodLoad: pb.SessionMethod_SESSION_METHOD_LOAD,
}

var states = map[State]pb.BindingState{
	Unbound: pb.BindingState_BINDING_STATE_UNBOUND,
	Pending: pb.BindingState_BINDING_STATE_PENDING,
	Bound:   pb.BindingState_BINDING_STATE_BOUND,
	Fenced:  pb.BindingState_BINDING_STATE_FENCED,
}

var kinds = map[HostToolKind]pb.HostToolKind{
	HostFilesystem: pb.HostToolKind_HOST_TOOL_KIND_FILESYSTEM,
	HostProcess:    pb.HostToolKind_HOST_TOOL_KIND_PROCESS,
	HostOther:      pb.HostToolKind_HOST_TOOL_KIND_OTHER,
}

// reverse returns the inverse of an enum map.
func reverse[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

var (
	methodsPB = reverse(methods)
	statesPB  = reverse(states)
	kindsPB   = reverse(kinds)
)

func statusPB(st Status) *pb.SessionStatus {
	out := &pb.SessionStatus{SessionId: st.SessionID, State: states[st.State], TupleSha256: st.TupleSHA256,
		GrantGeneration: st.GrantGeneration, Code: string(st.Code), Message: st.Message}
	if !st.LeaseNotAfter.IsZero() {
		out.LeaseNotAfter = st.LeaseNotAfter.UTC().Format(time.RFC3339Nano)
	}
	return out
}

func statusFromPB(s *pb.SessionStatus) (Status, error) {
	st := Status{SessionID: s.GetSessionId(), State: statesPB[s.GetState()], TupleSHA256: s.GetTupleSha256(),
		GrantGeneration: s.GetGrantGeneration(), Code: errcode.Code(s.GetCode()), Message: s.GetMessage()}
	if st.State == 0 {
		return Status{}, fmt.Errorf("plugin sent binding state %v", s.GetState())
	}
	if l := s.GetLeaseNotAfter(); l != "" {
		t, err := time.Parse(time.RFC3339Nano, l)
		if err != nil {
			return Status{}, fmt.Errorf("plugin sent lease_not_after %q: %v", l, err)
		}
		st.LeaseNotAfter = t
	}
	return st, nil
}

func metaPB(m Meta) map[string][]byte {
	if m == nil {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func metaFromPB(m map[string][]byte) Meta {
	if m == nil {
		return nil
	}
	out := make(Meta, len(m))
	for k, v := range m {
		out[k] = json.RawMessage(v)
	}
	return out
}

func envPB(env []acp.EnvVariable) []*pb.EnvVar {
	var out []*pb.EnvVar
	for _, e := range env {
		out = append(out, &pb.EnvVar{Name: e.Name, Value: e.Value})
	}
	return out
}

func envFromPB(env []*pb.EnvVar) []acp.EnvVariable {
	var out []acp.EnvVariable
	for _, e := range env {
		out = append(out, acp.EnvVariable{Name: e.GetName(), Value: e.GetValue()})
	}
	return out
}

func toolCallPB(c ToolCall) *pb.ToolCall {
	out := &pb.ToolCall{ConnId: c.ConnID, SessionId: c.SessionID, OpKey: c.OpKey, TimeoutMs: c.Timeout.Milliseconds()}
	switch t := c.Tool.(type) {
	case ReadTool:
		out.Tool = &pb.ToolCall_ReadTextFile{ReadTextFile: &pb.ReadTextFileTool{Path: t.Path, Line: int32(t.Line), Limit: int32(t.Limit)}}
	case WriteTool:
		out.Tool = &pb.ToolCall_WriteTextFile{WriteTextFile: &pb.WriteTextFileTool{Path: t.Path, Content: t.Content}}
	case EditTool:
		out.Tool = &pb.ToolCall_EditTextFile{EditTextFile: &pb.EditTextFileTool{Path: t.Path, OldText: t.OldText, NewText: t.NewText}}
	case ListTool:
		out.Tool = &pb.ToolCall_ListDirectory{ListDirectory: &pb.ListDirectoryTool{Path: t.Path}}
	case RunTool:
		out.Tool = &pb.ToolCall_RunCommand{RunCommand: &pb.RunCommandTool{Command: t.Command, Args: t.Args, Cwd: t.Cwd,
			Env: envPB(t.Env), OutputByteLimit: int64(t.OutputLimit), Verify: t.Verify}}
	case GlobTool:
		out.Tool = &pb.ToolCall_Glob{Glob: &pb.GlobTool{Pattern: t.Pattern, Dir: t.Dir}}
	case GrepTool:
		out.Tool = &pb.ToolCall_Grep{Grep: &pb.GrepTool{Pattern: t.Pattern, Dir: t.Dir, Fixed: t.Fixed, IgnoreCase: t.IgnoreCase}}
	}
	return out
}

func toolCallFromPB(c *pb.ToolCall) (ToolCall, error) {
	out := ToolCall{ConnID: c.GetConnId(), SessionID: c.GetSessionId(), OpKey: c.GetOpKey(),
		Timeout: time.Duration(c.GetTimeoutMs()) * time.Millisecond}
	switch t := c.GetTool().(type) {
	case *pb.ToolCall_ReadTextFile:
		out.Tool = ReadTool{Path: t.ReadTextFile.GetPath(), Line: int(t.ReadTextFile.GetLine()), Limit: int(t.ReadTextFile.GetLimit())}
	case *pb.ToolCall_WriteTextFile:
		out.Tool = WriteTool{Path: t.WriteTextFile.GetPath(), Content: t.WriteTextFile.GetContent()}
	case *pb.ToolCall_EditTextFile:
		e := t.EditTextFile
		out.Tool = EditTool{Path: e.GetPath(), OldText: e.GetOldText(), NewText: e.GetNewText()}
	case *pb.ToolCall_ListDirectory:
		out.Tool = ListTool{Path: t.ListDirectory.GetPath()}
	case *pb.ToolCall_RunCommand:
		r := t.RunCommand
		out.Tool = RunTool{Command: r.GetCommand(), Args: r.GetArgs(), Cwd: r.GetCwd(), Env: envFromPB(r.GetEnv()),
			OutputLimit: int(r.GetOutputByteLimit()), Verify: r.GetVerify()}
	case *pb.ToolCall_Glob:
		out.Tool = GlobTool{Pattern: t.Glob.GetPattern(), Dir: t.Glob.GetDir()}
	case *pb.ToolCall_Grep:
		g := t.Grep
		out.Tool = GrepTool{Pattern: g.GetPattern(), Dir: g.GetDir(), Fixed: g.GetFixed(), IgnoreCase: g.GetIgnoreCase()}
	default:
		return ToolCall{}, errcode.Errorf(errcode.CodeInvalid, "tool call names no tool")
	}
	return out, nil
}

func optInt32(p *int) *int32 {
	if p == nil {
		return nil
	}
	v := int32(*p)
	return &v
}

func optInt(p *int32) *int {
	if p == nil {
		return nil
	}
	v := int(*p)
	return &v
}

func planPB(p Plan) *pb.Plan {
	out := &pb.Plan{Ticket: p.Ticket, SessionId: p.SessionID, OpKey: p.OpKey, DeadlineUnixMs: p.Deadline.UnixMilli()}
	for _, c := range p.FenceCodes {
		out.FenceCodes = append(out.FenceCodes, string(c))
	}
	switch s := p.Step.(type) {
	case ReadStep:
		out.Step = &pb.Plan_Read{Read: &pb.ReadStep{Path: s.Path, Line: optInt32(s.Line), Limit: optInt32(s.Limit), Meta: metaPB(s.Meta)}}
	case WriteStep:
		out.Step = &pb.Plan_Write{Write: &pb.WriteStep{Path: s.Path, Content: s.Content, Meta: metaPB(s.Meta)}}
	case EditStep:
		out.Step = &pb.Plan_Edit{Edit: &pb.EditStep{Path: s.Path, OldText: s.OldText, NewText: s.NewText,
			ReadMeta: metaPB(s.ReadMeta), WriteMeta: metaPB(s.WriteMeta)}}
	case TerminalStep:
		out.Step = &pb.Plan_Terminal{Terminal: &pb.TerminalStep{Command: s.Command, Args: s.Args, Cwd: s.Cwd,
			Env: envPB(s.Env), OutputByteLimit: int64(s.OutputLimit), CleanupTimeoutMs: s.CleanupTimeout.Milliseconds(),
			CreateMeta: metaPB(s.CreateMeta), WaitMeta: metaPB(s.WaitMeta), KillMeta: metaPB(s.KillMeta),
			OutputMeta: metaPB(s.OutputMeta), ReleaseMeta: metaPB(s.ReleaseMeta), Dir: s.Dir}}
	}
	return out
}

func planFromPB(p *pb.Plan) (Plan, error) {
	out := Plan{Ticket: p.GetTicket(), SessionID: p.GetSessionId(), OpKey: p.GetOpKey(),
		Deadline: time.UnixMilli(p.GetDeadlineUnixMs())}
	for _, c := range p.GetFenceCodes() {
		out.FenceCodes = append(out.FenceCodes, errcode.Code(c))
	}
	switch s := p.GetStep().(type) {
	case *pb.Plan_Read:
		r := s.Read
		out.Step = ReadStep{Path: r.GetPath(), Line: optInt(r.Line), Limit: optInt(r.Limit), Meta: metaFromPB(r.GetMeta())}
	case *pb.Plan_Write:
		w := s.Write
		out.Step = WriteStep{Path: w.GetPath(), Content: w.GetContent(), Meta: metaFromPB(w.GetMeta())}
	case *pb.Plan_Edit:
		e := s.Edit
		out.Step = EditStep{Path: e.GetPath(), OldText: e.GetOldText(), NewText: e.GetNewText(),
			ReadMeta: metaFromPB(e.GetReadMeta()), WriteMeta: metaFromPB(e.GetWriteMeta())}
	case *pb.Plan_Terminal:
		out.Step = terminalFromPB(s.Terminal)
	default:
		return Plan{}, fmt.Errorf("plugin sent a plan with no step")
	}
	return out, nil
}

func terminalFromPB(t *pb.TerminalStep) TerminalStep {
	return TerminalStep{Command: t.GetCommand(), Args: t.GetArgs(), Cwd: t.GetCwd(), Env: envFromPB(t.GetEnv()),
		OutputLimit: int(t.GetOutputByteLimit()), CleanupTimeout: time.Duration(t.GetCleanupTimeoutMs()) * time.Millisecond,
		CreateMeta: metaFromPB(t.GetCreateMeta()), WaitMeta: metaFromPB(t.GetWaitMeta()), KillMeta: metaFromPB(t.GetKillMeta()),
		OutputMeta: metaFromPB(t.GetOutputMeta()), ReleaseMeta: metaFromPB(t.GetReleaseMeta()), Dir: t.GetDir()}
}

func reportPB(r Report) *pb.ReportRequest {
	out := &pb.ReportRequest{ConnId: r.ConnID, Ticket: r.Ticket, Check: r.Check}
	for _, f := range r.Failures {
		out.Failures = append(out.Failures, &pb.Failure{Request: f.Request, Code: string(f.Code), Message: f.Message, Transport: f.Transport})
	}
	return out
}

func reportFromPB(r *pb.ReportRequest) Report {
	out := Report{ConnID: r.GetConnId(), Ticket: r.GetTicket(), Check: r.GetCheck()}
	for _, f := range r.GetFailures() {
		out.Failures = append(out.Failures, Failure{Request: f.GetRequest(), Code: errcode.Code(f.GetCode()),
			Message: f.GetMessage(), Transport: f.GetTransport()})
	}
	return out
}

// attachResultPB encodes the host's answer to an attach call.
func attachResultPB(raw json.RawMessage, err error) *pb.AttachResult {
	var re *acp.RequestError
	switch {
	case err == nil:
		return &pb.AttachResult{Outcome: &pb.AttachResult_ResultJson{ResultJson: raw}}
	case errors.As(err, &re) && !errors.Is(err, ErrTransport):
		return &pb.AttachResult{Outcome: &pb.AttachResult_Error{Error: jsonRPCErrorPB(re)}}
	}
	return &pb.AttachResult{Outcome: &pb.AttachResult_TransportError{TransportError: err.Error()}}
}

// attachResultFromPB decodes it on the plugin side: the client's JSON-RPC
// error comes back as the identical *acp.RequestError; anything else but
// a result means the connection is gone.
func attachResultFromPB(r *pb.AttachResult) (json.RawMessage, error) {
	switch o := r.GetOutcome().(type) {
	case *pb.AttachResult_ResultJson:
		return json.RawMessage(o.ResultJson), nil
	case *pb.AttachResult_Error:
		return nil, jsonRPCErrorFromPB(o.Error)
	case *pb.AttachResult_TransportError:
		return nil, fmt.Errorf("%w: %s", ErrTransport, o.TransportError)
	}
	return nil, fmt.Errorf("%w: the host sent an empty attach result", ErrTransport)
}
