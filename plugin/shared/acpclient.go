package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

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

var _ ACPClient = &ACPClientStub{}

// Close closes the broker connection.
func (c *ACPClientStub) Close() error { return c.closer.Close() }

func metaJSON(m map[string]any) []byte {
	if m == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		// Every `_meta` value the plugin builds is plain JSON data.
		panic(fmt.Sprintf("shared: marshal _meta: %v", err))
	}
	return b
}

// MetaFromJSON decodes a `_meta` object. Empty input or JSON null is no
// meta; anything but an object is an error.
func MetaFromJSON(b []byte) (map[string]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: _meta is not a JSON object: %v", acpmeta.ErrMeta, err)
	}
	return m, nil
}

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
	resp, err := remote(ctx, c.client.ReadTextFile, &pb.AcpReadTextFileRequest{
		SessionId: string(p.SessionId), Path: p.Path, Line: int32Ptr(p.Line), Limit: int32Ptr(p.Limit), MetaJson: metaJSON(p.Meta)})
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	return acp.ReadTextFileResponse{Content: resp.GetContent()}, nil
}

// WriteTextFile implements ACPClient.
func (c *ACPClientStub) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	_, err := remote(ctx, c.client.WriteTextFile, &pb.AcpWriteTextFileRequest{
		SessionId: string(p.SessionId), Path: p.Path, Content: p.Content, MetaJson: metaJSON(p.Meta)})
	return acp.WriteTextFileResponse{}, err
}

// CreateTerminal implements ACPClient.
func (c *ACPClientStub) CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	req := &pb.AcpCreateTerminalRequest{SessionId: string(p.SessionId), Command: p.Command, Args: p.Args,
		Cwd: p.Cwd, MetaJson: metaJSON(p.Meta)}
	for _, e := range p.Env {
		req.Env = append(req.Env, &pb.EnvVar{Name: e.Name, Value: e.Value})
	}
	if p.OutputByteLimit != nil {
		v := int64(*p.OutputByteLimit)
		req.OutputByteLimit = &v
	}
	resp, err := remote(ctx, c.client.CreateTerminal, req)
	if err != nil {
		return acp.CreateTerminalResponse{}, err
	}
	return acp.CreateTerminalResponse{TerminalId: resp.GetTerminalId()}, nil
}

func terminalReq(sid acp.SessionId, tid string, meta map[string]any) *pb.AcpTerminalRequest {
	return &pb.AcpTerminalRequest{SessionId: string(sid), TerminalId: tid, MetaJson: metaJSON(meta)}
}

func exitFromPB(e *pb.AcpExitStatus) (*int, *string) {
	if e == nil {
		return nil, nil
	}
	var code *int
	if e.ExitCode != nil {
		v := int(e.GetExitCode())
		code = &v
	}
	return code, e.Signal
}

// TerminalOutput implements ACPClient.
func (c *ACPClientStub) TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	resp, err := remote(ctx, c.client.TerminalOutput, terminalReq(p.SessionId, p.TerminalId, p.Meta))
	if err != nil {
		return acp.TerminalOutputResponse{}, err
	}
	out := acp.TerminalOutputResponse{Output: resp.GetOutput(), Truncated: resp.GetTruncated()}
	if resp.ExitStatus != nil {
		code, sig := exitFromPB(resp.ExitStatus)
		out.ExitStatus = &acp.TerminalExitStatus{ExitCode: code, Signal: sig}
	}
	return out, nil
}

// WaitForTerminalExit implements ACPClient.
func (c *ACPClientStub) WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	resp, err := remote(ctx, c.client.WaitForTerminalExit, terminalReq(p.SessionId, p.TerminalId, p.Meta))
	if err != nil {
		return acp.WaitForTerminalExitResponse{}, err
	}
	code, sig := exitFromPB(resp)
	return acp.WaitForTerminalExitResponse{ExitCode: code, Signal: sig}, nil
}

// KillTerminal implements ACPClient.
func (c *ACPClientStub) KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	_, err := remote(ctx, c.client.KillTerminal, terminalReq(p.SessionId, p.TerminalId, p.Meta))
	return acp.KillTerminalResponse{}, err
}

// ReleaseTerminal implements ACPClient.
func (c *ACPClientStub) ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	_, err := remote(ctx, c.client.ReleaseTerminal, terminalReq(p.SessionId, p.TerminalId, p.Meta))
	return acp.ReleaseTerminalResponse{}, err
}

// Attach implements ACPClient.
func (c *ACPClientStub) Attach(ctx context.Context, p acpmeta.AttachRequest) (json.RawMessage, error) {
	resp, err := remote(ctx, c.client.Attach, &pb.AcpAttachRequest{SessionId: p.SessionID, TupleSha256: p.TupleSHA256})
	if err != nil {
		return nil, err
	}
	return json.RawMessage(resp.GetResultJson()), nil
}

// acpClientServer is the host side: each gRPC call performs one ACP client
// call on the host's connection, under the caller's ctx.
type acpClientServer struct {
	pb.UnimplementedAcpClientServer
	impl ACPClient
}

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
	resp, err := s.impl.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: acp.SessionId(r.GetSessionId()),
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
	if _, err := s.impl.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: acp.SessionId(r.GetSessionId()),
		Path: r.GetPath(), Content: r.GetContent(), Meta: meta}); err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpWriteTextFileResponse{}, nil
}

func (s *acpClientServer) CreateTerminal(ctx context.Context, r *pb.AcpCreateTerminalRequest) (*pb.AcpCreateTerminalResponse, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	p := acp.CreateTerminalRequest{SessionId: acp.SessionId(r.GetSessionId()), Command: r.GetCommand(),
		Args: r.GetArgs(), Cwd: r.Cwd, Meta: meta}
	for _, e := range r.GetEnv() {
		p.Env = append(p.Env, acp.EnvVariable{Name: e.GetName(), Value: e.GetValue()})
	}
	if r.OutputByteLimit != nil {
		v := int(r.GetOutputByteLimit())
		p.OutputByteLimit = &v
	}
	resp, err := s.impl.CreateTerminal(ctx, p)
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpCreateTerminalResponse{TerminalId: resp.TerminalId}, nil
}

func exitToPB(code *int, sig *string) *pb.AcpExitStatus {
	e := &pb.AcpExitStatus{Signal: sig}
	if code != nil {
		v := int32(*code)
		e.ExitCode = &v
	}
	return e
}

func (s *acpClientServer) TerminalOutput(ctx context.Context, r *pb.AcpTerminalRequest) (*pb.AcpTerminalOutputResponse, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	resp, err := s.impl.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: acp.SessionId(r.GetSessionId()),
		TerminalId: r.GetTerminalId(), Meta: meta})
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	out := &pb.AcpTerminalOutputResponse{Output: resp.Output, Truncated: resp.Truncated}
	if resp.ExitStatus != nil {
		out.ExitStatus = exitToPB(resp.ExitStatus.ExitCode, resp.ExitStatus.Signal)
	}
	return out, nil
}

func (s *acpClientServer) WaitForTerminalExit(ctx context.Context, r *pb.AcpTerminalRequest) (*pb.AcpExitStatus, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	resp, err := s.impl.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: acp.SessionId(r.GetSessionId()),
		TerminalId: r.GetTerminalId(), Meta: meta})
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return exitToPB(resp.ExitCode, resp.Signal), nil
}

func (s *acpClientServer) KillTerminal(ctx context.Context, r *pb.AcpTerminalRequest) (*pb.AcpEmpty, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	if _, err := s.impl.KillTerminal(ctx, acp.KillTerminalRequest{SessionId: acp.SessionId(r.GetSessionId()),
		TerminalId: r.GetTerminalId(), Meta: meta}); err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpEmpty{}, nil
}

func (s *acpClientServer) ReleaseTerminal(ctx context.Context, r *pb.AcpTerminalRequest) (*pb.AcpEmpty, error) {
	meta, err := reqMeta(ctx, r.GetMetaJson())
	if err != nil {
		return nil, err
	}
	if _, err := s.impl.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: acp.SessionId(r.GetSessionId()),
		TerminalId: r.GetTerminalId(), Meta: meta}); err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpEmpty{}, nil
}

func (s *acpClientServer) Attach(ctx context.Context, r *pb.AcpAttachRequest) (*pb.AcpAttachResponse, error) {
	raw, err := s.impl.Attach(ctx, acpmeta.AttachRequest{SessionID: r.GetSessionId(), TupleSHA256: r.GetTupleSha256()})
	if err != nil {
		return nil, acpErrorStatus(ctx, err)
	}
	return &pb.AcpAttachResponse{ResultJson: raw}, nil
}
