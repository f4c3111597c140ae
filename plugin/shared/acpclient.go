package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"google.golang.org/grpc"

	"github.com/tetherdev/tether/custodian/acpmeta"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// ACPClientStub is the plugin's ACPClient: each call is one gRPC call to the
// host's AcpClient service on a broker stream. Close closes the stream; the
// plugin closes it on Disconnect.
type ACPClientStub struct {
	client pb.AcpClientClient
	closer io.Closer
}

var (
	_ ACPClient = &ACPClientStub{}
	_ io.Closer = &ACPClientStub{}
)

// Close closes the broker connection.
func (c *ACPClientStub) Close() error { return c.closer.Close() }

func remote[Req, Resp any](ctx context.Context, f func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := f(ctx, req)
	if err != nil {
		var zero Resp
		return zero, acpErrorFromStatus(ctx, err)
	}
	return resp, nil
}

func int32Ptr(p *int) *int32 {
	if p == nil {
		return nil
	}
	v := int32(*p)
	return &v
}

// ReadTextFile implements ACPClient.
func (c *ACPClientStub) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	resp, err := remote(ctx, c.client.ReadTextFile, &pb.AcpReadTextFileRequest{CallId: CallID(ctx),
		SessionId: string(p.SessionId), Path: p.Path, Line: int32Ptr(p.Line), Limit: int32Ptr(p.Limit), MetaJson: metaJSON(p.Meta)})
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	return acp.ReadTextFileResponse{Content: resp.GetContent()}, nil
}

// WriteTextFile implements ACPClient.
func (c *ACPClientStub) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	_, err := remote(ctx, c.client.WriteTextFile, &pb.AcpWriteTextFileRequest{CallId: CallID(ctx),
		SessionId: string(p.SessionId), Path: p.Path, Content: p.Content, MetaJson: metaJSON(p.Meta)})
	return acp.WriteTextFileResponse{}, err
}

// RunTerminal implements ACPClient.
func (c *ACPClientStub) RunTerminal(ctx context.Context, r TerminalRun) (TerminalResult, error) {
	resp, err := remote(ctx, c.client.RunTerminal, runTerminalPB(CallID(ctx), r))
	if err != nil {
		return TerminalResult{}, err
	}
	return terminalResultFromPB(resp), nil
}

// Attach implements ACPClient.
func (c *ACPClientStub) Attach(ctx context.Context, p acpmeta.AttachRequest) (json.RawMessage, error) {
	resp, err := remote(ctx, c.client.Attach, &pb.AcpAttachRequest{SessionId: p.SessionID, TupleSha256: p.TupleSHA256})
	if err != nil {
		return nil, err
	}
	return json.RawMessage(resp.GetResultJson()), nil
}

// acpClientServer is the host side: each gRPC call performs the ACP client
// calls it names on the host's connection, under the caller's ctx, which
// carries the tool call id (WithCallID).
type acpClientServer struct {
	pb.UnimplementedAcpClientServer
	impl ACPClient
}

// reqMeta decodes a request's `_meta`; a malformed one is refused as
// invalid params, and nothing is sent.
func reqMeta(ctx context.Context, b []byte) (map[string]any, error) {
	m, err := MetaFromJSON(b)
	if err != nil {
		return nil, acpErrorStatus(ctx, acp.NewInvalidParams(map[string]any{"error": err.Error()}))
	}
	return m, nil
}

func intPtr(p *int32) *int {
	if p == nil {
		return nil
	}
	v := int(*p)
	return &v
}

func (s *acpClientServer) ReadTextFile(ctx context.Context, r *pb.AcpReadTextFileRequest) (*pb.AcpReadTextFileResponse, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	resp, err := s.impl.ReadTextFile(WithCallID(ctx, r.GetCallId()), acp.ReadTextFileRequest{SessionId: acp.SessionId(r.GetSessionId()),
		Path: r.GetPath(), Line: intPtr(r.Line), Limit: intPtr(r.Limit), Meta: meta})
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpReadTextFileResponse{Content: resp.Content}, nil
}

func (s *acpClientServer) WriteTextFile(ctx context.Context, r *pb.AcpWriteTextFileRequest) (*pb.AcpWriteTextFileResponse, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	if _, err := s.impl.WriteTextFile(WithCallID(ctx, r.GetCallId()), acp.WriteTextFileRequest{SessionId: acp.SessionId(r.GetSessionId()),
		Path: r.GetPath(), Content: r.GetContent(), Meta: meta}); err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpWriteTextFileResponse{}, nil
}

func (s *acpClientServer) RunTerminal(ctx context.Context, r *pb.AcpRunTerminalRequest) (*pb.AcpRunTerminalResponse, error) {
	run, err := terminalRunFromPB(ctx, r)
	if err != nil {
		return nil, err
	}
	res, err := s.impl.RunTerminal(WithCallID(ctx, r.GetCallId()), run)
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return terminalResultPB(res), nil
}

func (s *acpClientServer) Attach(ctx context.Context, r *pb.AcpAttachRequest) (*pb.AcpAttachResponse, error) {
	raw, err := s.impl.Attach(ctx, acpmeta.AttachRequest{SessionID: r.GetSessionId(), TupleSHA256: r.GetTupleSha256()})
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpAttachResponse{ResultJson: raw}, nil
}

// MaxCleanupTimeout bounds the clean-up time a RunTerminal request may ask
// the host for.
const MaxCleanupTimeout = time.Minute

// terminalRunFromPB decodes a RunTerminal request; malformed metas or
// timings are refused before anything is sent.
func terminalRunFromPB(ctx context.Context, r *pb.AcpRunTerminalRequest) (TerminalRun, error) {
	var metas [5]map[string]any
	for i, b := range [][]byte{r.GetCreateMetaJson(), r.GetWaitMetaJson(), r.GetKillMetaJson(), r.GetOutputMetaJson(), r.GetReleaseMetaJson()} {
		m, err := reqMeta(ctx, b)
		if err != nil {
			return TerminalRun{}, err
		}
		metas[i] = m
	}
	cleanup := time.Duration(r.GetCleanupTimeoutMs()) * time.Millisecond
	if cleanup <= 0 || cleanup > MaxCleanupTimeout || r.GetDeadlineUnixMs() <= 0 {
		return TerminalRun{}, acpErrorStatus(ctx, acp.NewInvalidParams(map[string]any{
			"error": fmt.Sprintf("run terminal: deadline must be set and cleanup_timeout_ms 1..%d", MaxCleanupTimeout.Milliseconds())}))
	}
	create := acp.CreateTerminalRequest{SessionId: acp.SessionId(r.GetSessionId()), Command: r.GetCommand(),
		Args: r.GetArgs(), Cwd: r.Cwd, Meta: metas[0]}
	for _, e := range r.GetEnv() {
		create.Env = append(create.Env, acp.EnvVariable{Name: e.GetName(), Value: e.GetValue()})
	}
	if r.OutputByteLimit != nil {
		v := int(r.GetOutputByteLimit())
		create.OutputByteLimit = &v
	}
	return TerminalRun{Create: create, Deadline: time.UnixMilli(r.GetDeadlineUnixMs()), CleanupTimeout: cleanup,
		WaitMeta: metas[1], KillMeta: metas[2], OutputMeta: metas[3], ReleaseMeta: metas[4]}, nil
}

// runTerminalPB encodes a RunTerminal request.
func runTerminalPB(callID string, r TerminalRun) *pb.AcpRunTerminalRequest {
	c := r.Create
	req := &pb.AcpRunTerminalRequest{CallId: callID, SessionId: string(c.SessionId), Command: c.Command, Args: c.Args,
		Cwd: c.Cwd, DeadlineUnixMs: r.Deadline.UnixMilli(), CleanupTimeoutMs: r.CleanupTimeout.Milliseconds(),
		CreateMetaJson: metaJSON(c.Meta), WaitMetaJson: metaJSON(r.WaitMeta), KillMetaJson: metaJSON(r.KillMeta),
		OutputMetaJson: metaJSON(r.OutputMeta), ReleaseMetaJson: metaJSON(r.ReleaseMeta)}
	for _, e := range c.Env {
		req.Env = append(req.Env, &pb.EnvVar{Name: e.Name, Value: e.Value})
	}
	if c.OutputByteLimit != nil {
		v := int64(*c.OutputByteLimit)
		req.OutputByteLimit = &v
	}
	return req
}

func exitToPB(e *acp.TerminalExitStatus) *pb.AcpExitStatus {
	if e == nil {
		return nil
	}
	out := &pb.AcpExitStatus{Signal: e.Signal}
	if e.ExitCode != nil {
		v := int32(*e.ExitCode)
		out.ExitCode = &v
	}
	return out
}

func exitFromPB(e *pb.AcpExitStatus) *acp.TerminalExitStatus {
	if e == nil {
		return nil
	}
	out := &acp.TerminalExitStatus{Signal: e.Signal}
	if e.ExitCode != nil {
		v := int(e.GetExitCode())
		out.ExitCode = &v
	}
	return out
}

func terminalResultPB(r TerminalResult) *pb.AcpRunTerminalResponse {
	s := r.Steps
	return &pb.AcpRunTerminalResponse{TerminalId: r.TerminalID, Create: stepPB(s.Create), Wait: stepPB(s.Wait),
		Kill: stepPB(s.Kill), Output: stepPB(s.Output), Release: stepPB(s.Release), Exit: exitToPB(r.Exit),
		OutputText: r.Output, Truncated: r.Truncated, TimedOut: r.TimedOut, Cancelled: r.Cancelled}
}

func terminalResultFromPB(r *pb.AcpRunTerminalResponse) TerminalResult {
	return TerminalResult{TerminalID: r.GetTerminalId(), Steps: TerminalSteps{Create: stepFromPB(r.GetCreate()),
		Wait: stepFromPB(r.GetWait()), Kill: stepFromPB(r.GetKill()), Output: stepFromPB(r.GetOutput()),
		Release: stepFromPB(r.GetRelease())}, Exit: exitFromPB(r.GetExit()), Output: r.GetOutputText(),
		Truncated: r.GetTruncated(), TimedOut: r.GetTimedOut(), Cancelled: r.GetCancelled()}
}
