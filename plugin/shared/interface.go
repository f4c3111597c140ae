// Package shared is the contract between a host agent and tether-plugin:
// the handshake, the plugin map, the two Go interfaces (Plugin, served by
// the plugin; ACPClient, served by the host for each ACP connection) and
// their gRPC adapters (grpc.go, acpclient.go). plugin/proto is the same
// contract for hosts in other languages.
package shared

import (
	"context"
	"encoding/json"
	"errors"

	acp "github.com/coder/acp-go-sdk"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/tetherdev/tether/custodian/acpmeta"
	pb "github.com/tetherdev/tether/plugin/proto"
)

// PluginName is the name the host dispenses.
const PluginName = "tether"

// ProtocolVersions are the plugin protocol versions this build speaks, newest
// last. A host and a plugin that share none refuse to start, and the error
// names both lists.
var ProtocolVersions = []int{1}

// Handshake is the go-plugin handshake. The cookie only tells a user who
// runs the binary by hand what it is for; it is not a security control.
// AutoMTLS and the SHA-256 checked by plugin/host.Load are.
var Handshake = goplugin.HandshakeConfig{
	MagicCookieKey:   "TETHER_PLUGIN_COOKIE",
	MagicCookieValue: "c0a1d2b7-tether-plugin-v1-5f0e9c4a",
}

// PluginSets returns the versioned plugin sets for versions, each serving or
// dispensing impl under PluginName (impl is nil on the host side).
func PluginSets(versions []int, impl Plugin) map[int]goplugin.PluginSet {
	sets := make(map[int]goplugin.PluginSet, len(versions))
	for _, v := range versions {
		sets[v] = goplugin.PluginSet{PluginName: &GRPCPlugin{Impl: impl}}
	}
	return sets
}

// Plugin is what tether-plugin serves. Every method refuses with an error
// that carries a tether code (acpmeta.CodeOf) and names the failed check.
type Plugin interface {
	// Connect hands the plugin one ACP connection; client performs ACP
	// client calls on it and principal is the identity the host
	// authenticated for it. The returned id names the connection in every
	// later call. The plugin uses client until Disconnect.
	Connect(ctx context.Context, client ACPClient, principal string) (connID string, err error)
	// Disconnect reports that the connection ended; bindings on it fence.
	Disconnect(ctx context.Context, connID string) error
	// OpenSession reports session/new or session/load and its `_meta`.
	OpenSession(ctx context.Context, req *pb.OpenSessionRequest) (*pb.SessionStatus, error)
	// Status reports a session's binding state.
	Status(ctx context.Context, req *pb.StatusRequest) (*pb.SessionStatus, error)
	// ToolPolicy decides whether the host may run its own tool.
	ToolPolicy(ctx context.Context, req *pb.ToolPolicyRequest) (*pb.ToolPolicyResponse, error)

	ReadTextFile(ctx context.Context, req *pb.ReadTextFileToolRequest) (*pb.ReadTextFileToolResponse, error)
	WriteTextFile(ctx context.Context, req *pb.WriteTextFileToolRequest) (*pb.WriteTextFileToolResponse, error)
	EditTextFile(ctx context.Context, req *pb.EditTextFileToolRequest) (*pb.EditTextFileToolResponse, error)
	ListDirectory(ctx context.Context, req *pb.ListDirectoryToolRequest) (*pb.ListDirectoryToolResponse, error)
	RunCommand(ctx context.Context, req *pb.RunCommandToolRequest) (*pb.RunCommandToolResponse, error)
	Glob(ctx context.Context, req *pb.GlobToolRequest) (*pb.GlobToolResponse, error)
	Grep(ctx context.Context, req *pb.GrepToolRequest) (*pb.GrepToolResponse, error)
}

// ACPClient is the closed set of ACP client calls the plugin may make on a
// host's ACP connection. *acp.AgentSideConnection provides all but Attach;
// plugin/host adds Attach. Errors from the ACP client are *acp.RequestError
// values carried intact; a lost connection wraps ErrTransport.
type ACPClient interface {
	ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error)
	WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error)
	CreateTerminal(ctx context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error)
	TerminalOutput(ctx context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error)
	WaitForTerminalExit(ctx context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error)
	KillTerminal(ctx context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error)
	ReleaseTerminal(ctx context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error)
	// Attach calls `_tether/attach` and returns its raw JSON result; the
	// plugin decodes it strictly.
	Attach(ctx context.Context, p acpmeta.AttachRequest) (json.RawMessage, error)
}

// ErrTransport is wrapped by every failure to reach the other side: the ACP
// connection closed, the broker stream or the plugin process died. Its fate
// is unknown, so a binding that sees it fences.
var ErrTransport = errors.New("transport lost")

// GRPCPlugin is the go-plugin glue: Impl is set on the plugin side only.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Plugin
}

var _ goplugin.GRPCPlugin = &GRPCPlugin{}

// GRPCServer registers the Plugin service on the plugin's gRPC server.
func (p *GRPCPlugin) GRPCServer(broker *goplugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterPluginServer(s, &pluginServer{impl: p.Impl, broker: broker})
	return nil
}

// GRPCClient returns the host's Plugin: a *PluginClient.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, broker *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &PluginClient{client: pb.NewPluginClient(c), broker: broker}, nil
}
