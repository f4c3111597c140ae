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
// names both lists. Version 2 replaced the per-step terminal methods of the
// AcpClient service with RunTerminal and added call ids (cancellation).
var ProtocolVersions = []int{2}

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

// ACPClient is the closed set of calls the plugin may make on a host's ACP
// connection: two fs requests, one whole terminal run (RunTerminal: create,
// wait, kill if needed, output, release, in that fixed order) and
// `_tether/attach`. plugin/host implements it on an
// *acp.AgentSideConnection. Errors from the ACP client are *acp.RequestError
// values carried intact; a lost connection wraps ErrTransport; a call the
// host refused because the tool call's caller cancelled wraps ErrCancelled.
// The tool call a request serves travels in its ctx (WithCallID).
type ACPClient interface {
	ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error)
	WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error)
	// RunTerminal runs one command to its end and reports every step (see
	// TerminalResult). Its error is only for a call that never reached the
	// host's ACP connection (transport lost, or refused after a cancel).
	RunTerminal(ctx context.Context, r TerminalRun) (TerminalResult, error)
	// Attach calls `_tether/attach` and returns its raw JSON result; the
	// plugin decodes it strictly.
	Attach(ctx context.Context, p acpmeta.AttachRequest) (json.RawMessage, error)
}

// ErrTransport is wrapped by every failure to reach the other side: the ACP
// connection closed, the broker stream or the plugin process died. Its fate
// is unknown, so a binding that sees it fences.
var ErrTransport = errors.New("transport lost")

// ErrCancelled is wrapped by a tool call, or one of its ACP calls, that its
// caller cancelled. It says nothing about the binding and never fences it.
var ErrCancelled = errors.New("cancelled by the caller")

// callIDKey is the context key of the tool call id.
type callIDKey struct{}

// WithCallID returns ctx naming the tool call (ToolContext.call_id) whose
// ACP calls are made under it.
func WithCallID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, callIDKey{}, id)
}

// CallID returns the tool call id ctx carries, or "".
func CallID(ctx context.Context) string {
	id, _ := ctx.Value(callIDKey{}).(string)
	return id
}

// ValidCallID reports whether id may name a tool call: empty, or 1-64 of
// [A-Za-z0-9_-].
func ValidCallID(id string) bool {
	if len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

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
