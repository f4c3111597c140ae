package shared

import (
	"context"
	"fmt"
	"io"
	"sync"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/tetherdev/tether/plugin/proto"
)

// PluginClient is the host's Plugin: each call is one gRPC call to the
// plugin. Connect serves the given ACPClient on a GRPCBroker stream until
// Disconnect (or Close) stops it.
type PluginClient struct {
	client pb.PluginClient
	broker *goplugin.GRPCBroker

	mu     sync.Mutex
	served map[string]*servedClient
}

var _ Plugin = &PluginClient{}

// servedClient is one AcpClient server on a broker stream. stop joins the
// AcceptAndServe goroutine.
type servedClient struct {
	srv  chan *grpc.Server
	done chan struct{}
	once sync.Once
}

func (s *servedClient) stop() {
	s.once.Do(func() {
		select {
		case srv := <-s.srv:
			srv.Stop()
		case <-s.done:
		}
		<-s.done
	})
}

// serveACPClient starts serving impl on a fresh broker id.
func (c *PluginClient) serveACPClient(impl ACPClient) (uint32, *servedClient) {
	id := c.broker.NextId()
	s := &servedClient{srv: make(chan *grpc.Server, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		c.broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
			srv := grpc.NewServer(ServerOptions(opts...)...)
			pb.RegisterAcpClientServer(srv, &acpClientServer{impl: impl})
			s.srv <- srv
			return srv
		})
	}()
	return id, s
}

// Connect implements Plugin.
func (c *PluginClient) Connect(ctx context.Context, client ACPClient, principal string) (string, error) {
	id, served := c.serveACPClient(client)
	resp, err := c.client.Connect(ctx, &pb.ConnectRequest{BrokerId: id, Principal: principal})
	if err != nil {
		served.stop()
		return "", toolErrorFromStatus(ctx, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.served == nil {
		c.served = make(map[string]*servedClient)
	}
	c.served[resp.GetConnId()] = served
	return resp.GetConnId(), nil
}

// Disconnect implements Plugin. The broker stream is stopped even when the
// plugin cannot be told.
func (c *PluginClient) Disconnect(ctx context.Context, connID string) error {
	c.mu.Lock()
	served := c.served[connID]
	delete(c.served, connID)
	c.mu.Unlock()
	_, err := c.client.Disconnect(ctx, &pb.DisconnectRequest{ConnId: connID})
	if served != nil {
		served.stop()
	}
	return toolErrorFromStatus(ctx, err)
}

// Close stops every AcpClient server this client still serves.
func (c *PluginClient) Close() error {
	c.mu.Lock()
	served := c.served
	c.served = nil
	c.mu.Unlock()
	for _, s := range served {
		s.stop()
	}
	return nil
}

// call runs one unary call and maps its error.
func call[Req, Resp any](ctx context.Context, f func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	resp, err := f(ctx, req)
	if err != nil {
		var zero Resp
		return zero, toolErrorFromStatus(ctx, err)
	}
	return resp, nil
}

// OpenSession implements Plugin.
func (c *PluginClient) OpenSession(ctx context.Context, req *pb.OpenSessionRequest) (*pb.SessionStatus, error) {
	return call(ctx, c.client.OpenSession, req)
}

// Status implements Plugin.
func (c *PluginClient) Status(ctx context.Context, req *pb.StatusRequest) (*pb.SessionStatus, error) {
	return call(ctx, c.client.Status, req)
}

// ToolPolicy implements Plugin.
func (c *PluginClient) ToolPolicy(ctx context.Context, req *pb.ToolPolicyRequest) (*pb.ToolPolicyResponse, error) {
	return call(ctx, c.client.ToolPolicy, req)
}

// ReadTextFile implements Plugin.
func (c *PluginClient) ReadTextFile(ctx context.Context, req *pb.ReadTextFileToolRequest) (*pb.ReadTextFileToolResponse, error) {
	return call(ctx, c.client.ReadTextFile, req)
}

// WriteTextFile implements Plugin.
func (c *PluginClient) WriteTextFile(ctx context.Context, req *pb.WriteTextFileToolRequest) (*pb.WriteTextFileToolResponse, error) {
	return call(ctx, c.client.WriteTextFile, req)
}

// EditTextFile implements Plugin.
func (c *PluginClient) EditTextFile(ctx context.Context, req *pb.EditTextFileToolRequest) (*pb.EditTextFileToolResponse, error) {
	return call(ctx, c.client.EditTextFile, req)
}

// ListDirectory implements Plugin.
func (c *PluginClient) ListDirectory(ctx context.Context, req *pb.ListDirectoryToolRequest) (*pb.ListDirectoryToolResponse, error) {
	return call(ctx, c.client.ListDirectory, req)
}

// RunCommand implements Plugin.
func (c *PluginClient) RunCommand(ctx context.Context, req *pb.RunCommandToolRequest) (*pb.RunCommandToolResponse, error) {
	return call(ctx, c.client.RunCommand, req)
}

// Glob implements Plugin.
func (c *PluginClient) Glob(ctx context.Context, req *pb.GlobToolRequest) (*pb.GlobToolResponse, error) {
	return call(ctx, c.client.Glob, req)
}

// Grep implements Plugin.
func (c *PluginClient) Grep(ctx context.Context, req *pb.GrepToolRequest) (*pb.GrepToolResponse, error) {
	return call(ctx, c.client.Grep, req)
}

// pluginServer is the plugin side: gRPC requests to Impl. Every method
// passes the server's ctx on; none starts from context.Background.
type pluginServer struct {
	pb.UnimplementedPluginServer
	impl   Plugin
	broker *goplugin.GRPCBroker
}

// serve runs one Impl method and maps its error.
func serve[Req, Resp any](ctx context.Context, f func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	resp, err := f(ctx, req)
	if err != nil {
		var zero Resp
		return zero, toolErrorStatus(err)
	}
	return resp, nil
}

func (s *pluginServer) Connect(ctx context.Context, req *pb.ConnectRequest) (*pb.ConnectResponse, error) {
	conn, err := s.broker.DialWithOptions(req.GetBrokerId(), DialOptions()...)
	if err != nil {
		return nil, toolErrorStatus(fmt.Errorf("%w: dial broker stream %d: %v", ErrTransport, req.GetBrokerId(), err))
	}
	client := &ACPClientStub{client: pb.NewAcpClientClient(conn), closer: conn}
	id, err := s.impl.Connect(ctx, client, req.GetPrincipal())
	if err != nil {
		_ = conn.Close()
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

func (s *pluginServer) OpenSession(ctx context.Context, req *pb.OpenSessionRequest) (*pb.SessionStatus, error) {
	return serve(ctx, s.impl.OpenSession, req)
}

func (s *pluginServer) Status(ctx context.Context, req *pb.StatusRequest) (*pb.SessionStatus, error) {
	return serve(ctx, s.impl.Status, req)
}

func (s *pluginServer) ToolPolicy(ctx context.Context, req *pb.ToolPolicyRequest) (*pb.ToolPolicyResponse, error) {
	return serve(ctx, s.impl.ToolPolicy, req)
}

func (s *pluginServer) ReadTextFile(ctx context.Context, req *pb.ReadTextFileToolRequest) (*pb.ReadTextFileToolResponse, error) {
	return serve(ctx, s.impl.ReadTextFile, req)
}

func (s *pluginServer) WriteTextFile(ctx context.Context, req *pb.WriteTextFileToolRequest) (*pb.WriteTextFileToolResponse, error) {
	return serve(ctx, s.impl.WriteTextFile, req)
}

func (s *pluginServer) EditTextFile(ctx context.Context, req *pb.EditTextFileToolRequest) (*pb.EditTextFileToolResponse, error) {
	return serve(ctx, s.impl.EditTextFile, req)
}

func (s *pluginServer) ListDirectory(ctx context.Context, req *pb.ListDirectoryToolRequest) (*pb.ListDirectoryToolResponse, error) {
	return serve(ctx, s.impl.ListDirectory, req)
}

func (s *pluginServer) RunCommand(ctx context.Context, req *pb.RunCommandToolRequest) (*pb.RunCommandToolResponse, error) {
	return serve(ctx, s.impl.RunCommand, req)
}

func (s *pluginServer) Glob(ctx context.Context, req *pb.GlobToolRequest) (*pb.GlobToolResponse, error) {
	return serve(ctx, s.impl.Glob, req)
}

func (s *pluginServer) Grep(ctx context.Context, req *pb.GrepToolRequest) (*pb.GrepToolResponse, error) {
	return serve(ctx, s.impl.Grep, req)
}

var _ io.Closer = &ACPClientStub{}
