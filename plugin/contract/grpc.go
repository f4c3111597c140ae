package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherdev/tether/admission/errcode"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// PluginClient is the host's Plugin: each call is one gRPC call to the
// plugin (OpenSession one stream). It holds no state of its own.
type PluginClient struct {
	client pb.PluginClient
}

var _ Plugin = &PluginClient{}

// call runs one unary call and maps its error.
func call[Req, Resp any](ctx context.Context, f func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := f(ctx, req)
	if err != nil {
		var zero Resp
		return zero, toolErrorFromStatus(ctx, err)
	}
	return resp, nil
}

// Connect implements Plugin.
func (c *PluginClient) Connect(ctx context.Context, principal string) (string, error) {
	resp, err := call(ctx, c.client.Connect, &pb.ConnectRequest{Principal: principal})
	return resp.GetConnId(), err
}

// Disconnect implements Plugin.
func (c *PluginClient) Disconnect(ctx context.Context, connID string) error {
	_, err := call(ctx, c.client.Disconnect, &pb.DisconnectRequest{ConnId: connID})
	return err
}

// OpenSession implements Plugin: the stream carries the request, at most
// one attach call and its answer, and the status. An attach for any other
// session than the one being opened is refused and nothing is sent.
func (c *PluginClient) OpenSession(ctx context.Context, req OpenRequest, attach Attacher) (Status, error) {
	meta, err := metaJSON(req.Meta)
	if err != nil {
		return Status{}, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream however this returns
	stream, err := c.client.OpenSession(sctx)
	if err != nil {
		return Status{}, toolErrorFromStatus(ctx, err)
	}
	open := &pb.OpenSessionRequest{ConnId: req.ConnID, SessionId: req.SessionID, Method: methods[req.Method], MetaJson: meta}
	if err := stream.Send(&pb.OpenSessionUp{Msg: &pb.OpenSessionUp_Open{Open: open}}); err != nil {
		return Status{}, toolErrorFromStatus(ctx, err)
	}
	for attached := false; ; attached = true {
		down, err := stream.Recv()
		if err != nil {
			return Status{}, toolErrorFromStatus(ctx, err)
		}
		ac := down.GetAttach()
		switch {
		case down.GetStatus() != nil:
			return statusFromPB(down.GetStatus())
		case ac == nil:
			return Status{}, fmt.Errorf("%w: plugin sent an empty open-session message", ErrTransport)
		case attached || ac.GetSessionId() != req.SessionID:
			return Status{}, errcode.Errorf(errcode.CodeInternal,
				"plugin asked to attach session %q while opening %q (at most once, for that session): nothing sent", ac.GetSessionId(), req.SessionID)
		}
		actx, acancel := context.WithTimeout(ctx, AttachTimeout)
		raw, aerr := attach(actx, req.SessionID, ac.GetTupleSha256())
		acancel()
		if err := stream.Send(&pb.OpenSessionUp{Msg: &pb.OpenSessionUp_AttachResult{AttachResult: attachResultPB(raw, aerr)}}); err != nil {
			return Status{}, toolErrorFromStatus(ctx, err)
		}
	}
}

// metaJSON encodes a session request's `_meta` once for the plugin.
func metaJSON(m map[string]any) ([]byte, error) {
	if m == nil {
		return nil, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, errcode.Errorf(errcode.CodeInvalid, "_meta does not marshal: %v", err)
	}
	return b, nil
}

// Status implements Plugin.
func (c *PluginClient) Status(ctx context.Context, connID, sessionID string) (Status, error) {
	resp, err := call(ctx, c.client.Status, &pb.StatusRequest{ConnId: connID, SessionId: sessionID})
	if err != nil {
		return Status{}, err
	}
	return statusFromPB(resp)
}

// ToolPolicy implements Plugin: a refusal is a *errcode.Error with the
// plugin's code (denied if it named none from the closed set).
func (c *PluginClient) ToolPolicy(ctx context.Context, connID, sessionID, tool string, kind HostToolKind) error {
	resp, err := call(ctx, c.client.ToolPolicy, &pb.ToolPolicyRequest{ConnId: connID, SessionId: sessionID, Tool: tool, Kind: kinds[kind]})
	switch {
	case err != nil:
		return err
	case resp.GetAllow():
		return nil
	}
	code := errcode.Code(resp.GetCode())
	if !code.Valid() {
		code = errcode.CodeDenied
	}
	return &errcode.Error{Code: code, Message: resp.GetMessage()}
}

// Authorize implements Plugin.
func (c *PluginClient) Authorize(ctx context.Context, tc ToolCall) (Plan, error) {
	resp, err := call(ctx, c.client.Authorize, toolCallPB(tc))
	if err != nil {
		return Plan{}, err
	}
	return planFromPB(resp)
}

// Report implements Plugin.
func (c *PluginClient) Report(ctx context.Context, r Report) error {
	_, err := call(ctx, c.client.Report, reportPB(r))
	return err
}

// pluginServer is the plugin side: gRPC requests to Impl. Every method
// passes the server's ctx on; none starts from context.Background.
type pluginServer struct {
	pb.UnimplementedPluginServer
	impl Plugin
}

func (s *pluginServer) Connect(ctx context.Context, req *pb.ConnectRequest) (*pb.ConnectResponse, error) {
	id, err := s.impl.Connect(ctx, req.GetPrincipal())
	if err != nil {
		return nil, toolErrorStatus(err)
	}
	return &pb.ConnectResponse{ConnId: id}, nil
}

func (s *pluginServer) Disconnect(ctx context.Context, req *pb.DisconnectRequest) (*pb.DisconnectResponse, error) {
	if err := s.impl.Disconnect(ctx, req.GetConnId()); err != nil {
		return nil, toolErrorStatus(err)
	}
	return &pb.DisconnectResponse{}, nil
}

// OpenSession serves the stream: the first message opens; the attach the
// plugin asks for goes down, its answer comes up.
func (s *pluginServer) OpenSession(stream pb.Plugin_OpenSessionServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "open session: the first message must be open")
	}
	meta, err := MetaFromJSON(open.GetMetaJson())
	if err != nil {
		return toolErrorStatus(errcode.Errorf(errcode.CodeInvalid, "open session: %v", err))
	}
	method := methodsPB[open.GetMethod()]
	if method == 0 {
		return toolErrorStatus(errcode.Errorf(errcode.CodeInvalid, "open session: method must be new or load"))
	}
	req := OpenRequest{ConnID: open.GetConnId(), SessionID: open.GetSessionId(), Method: method, Meta: meta}
	st, err := s.impl.OpenSession(stream.Context(), req, streamAttacher(stream))
	if err != nil {
		return toolErrorStatus(err)
	}
	return stream.Send(&pb.OpenSessionDown{Msg: &pb.OpenSessionDown_Status{Status: statusPB(st)}})
}

// streamAttacher asks the host for `_tether/attach` on the stream and
// waits for its answer until ctx ends. The goroutine that receives ends
// with the stream, when the handler returns.
func streamAttacher(stream pb.Plugin_OpenSessionServer) Attacher {
	return func(ctx context.Context, sid, sha string) (json.RawMessage, error) {
		down := &pb.OpenSessionDown{Msg: &pb.OpenSessionDown_Attach{Attach: &pb.AttachCall{SessionId: sid, TupleSha256: sha}}}
		if err := stream.Send(down); err != nil {
			return nil, fmt.Errorf("%w: send attach call: %v", ErrTransport, err)
		}
		type recv struct {
			up  *pb.OpenSessionUp
			err error
		}
		got := make(chan recv, 1)
		go func() {
			up, err := stream.Recv()
			got <- recv{up, err}
		}()
		select {
		case r := <-got:
			if r.err != nil || r.up.GetAttachResult() == nil {
				return nil, fmt.Errorf("%w: no attach result from the host: %v", ErrTransport, r.err)
			}
			return attachResultFromPB(r.up.GetAttachResult())
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *pluginServer) Status(ctx context.Context, req *pb.StatusRequest) (*pb.SessionStatus, error) {
	st, err := s.impl.Status(ctx, req.GetConnId(), req.GetSessionId())
	if err != nil {
		return nil, toolErrorStatus(err)
	}
	return statusPB(st), nil
}

// ToolPolicy answers a refusal as allow=false with its code, not as an
// error; an unknown kind is refused too.
func (s *pluginServer) ToolPolicy(ctx context.Context, req *pb.ToolPolicyRequest) (*pb.ToolPolicyResponse, error) {
	err := s.impl.ToolPolicy(ctx, req.GetConnId(), req.GetSessionId(), req.GetTool(), kindsPB[req.GetKind()])
	if err == nil {
		return &pb.ToolPolicyResponse{Allow: true}, nil
	}
	var we *errcode.Error
	if !errors.As(err, &we) {
		return nil, toolErrorStatus(err)
	}
	return &pb.ToolPolicyResponse{Allow: false, Code: string(we.Code), Message: we.Message}, nil
}

func (s *pluginServer) Authorize(ctx context.Context, req *pb.ToolCall) (*pb.Plan, error) {
	tc, err := toolCallFromPB(req)
	if err != nil {
		return nil, toolErrorStatus(err)
	}
	p, err := s.impl.Authorize(ctx, tc)
	if err != nil {
		return nil, toolErrorStatus(err)
	}
	return planPB(p), nil
}

func (s *pluginServer) Report(ctx context.Context, req *pb.ReportRequest) (*pb.ReportResponse, error) {
	if err := s.impl.Report(ctx, reportFromPB(req)); err != nil {
		return nil, toolErrorStatus(err)
	}
	return &pb.ReportResponse{}, nil
}
