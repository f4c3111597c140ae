// Package contract is the contract between a host agent and tether-plugin:
// the handshake, the plugin map, the Go interface the plugin serves
// (Plugin), the session types it answers (session.go), the Go types of a
// plan (plan.go) and the two gRPC adapters (grpc.go). plugin/proto is the
// same contract for hosts in other languages. It imports no implementation
// (TestContractLinksNoImplementation): plugin/binding, plugin/server and
// plugin/host import it, never the other way.
//
// The plugin decides, the host sends: for each tool call the host asks the
// plugin to Authorize it and gets back a Plan, the exact ACP requests of
// that call with their `_meta`, which the host sends on its own ACP
// connection. The plugin never calls the host.
package contract

import (
	"context"
	"encoding/json"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/tetherdev/tether/plugin/proto"
)

// PluginName is the name the host dispenses.
const PluginName = "tether"

// ProtocolVersions are the plugin protocol versions this build speaks, newest
// last. A host and a plugin that share none refuse to start, and the error
// names both lists. Version 3 replaced the AcpClient service (the plugin's
// callbacks into the host) with plans the host sends itself (Authorize,
// Report) and a streamed OpenSession that carries `_tether/attach`.
var ProtocolVersions = []int{3}

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

// Plugin is what tether-plugin serves. Every method refuses with a
// *errcode.Error that carries a tether code (acperr.CodeOf) and names the
// failed check.
type Plugin interface {
	// Connect names one ACP connection of the host; principal is the
	// identity the host authenticated for it. The returned id names the
	// connection in every later call.
	Connect(ctx context.Context, principal string) (connID string, err error)
	// Disconnect reports that the connection ended; bindings on it fence.
	Disconnect(ctx context.Context, connID string) error
	// OpenSession reports session/new or session/load and its `_meta`.
	// When a bind passes every check that needs no peer, the plugin calls
	// attach once, for req.SessionID, and decides on its answer.
	OpenSession(ctx context.Context, req OpenRequest, attach Attacher) (Status, error)
	// Status reports a session's binding state to the connection's
	// principal.
	Status(ctx context.Context, connID, sessionID string) (Status, error)
	// ToolPolicy decides whether the host may run its own tool: nil
	// allows it; a refusal is a *errcode.Error.
	ToolPolicy(ctx context.Context, connID, sessionID, tool string, kind HostToolKind) error
	// Authorize authorizes one tool call and returns its plan, or the
	// refusal; nothing may be sent for a refused call.
	Authorize(ctx context.Context, call ToolCall) (Plan, error)
	// Report applies what a plan's execution showed: fences for the
	// failures, and for Check the binding check after glob and grep.
	Report(ctx context.Context, r Report) error
}

// OpenRequest reports one session/new or session/load.
type OpenRequest struct {
	ConnID    string
	SessionID string
	Method    Method
	// Meta is the request's whole `_meta`; the plugin reads only
	// `tether/bind`.
	Meta map[string]any
}

// Attacher sends `_tether/attach` {session_id, tuple_sha256} on the host's
// ACP connection and returns its raw JSON result. The client's refusal is
// the *acp.RequestError intact; a lost connection wraps ErrTransport.
type Attacher func(ctx context.Context, sessionID, tupleSHA256 string) (json.RawMessage, error)

// ErrTransport is wrapped by every failure to reach the other side: the ACP
// connection closed, the plugin process died. Its fate is unknown, so a
// binding that sees it fences.
var ErrTransport = errors.New("transport lost")

// GRPCPlugin is the go-plugin glue: Impl is set on the plugin side only.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl Plugin
}

var _ goplugin.GRPCPlugin = &GRPCPlugin{}

// GRPCServer registers the Plugin service on the plugin's gRPC server.
func (p *GRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterPluginServer(s, &pluginServer{impl: p.Impl})
	return nil
}

// GRPCClient returns the host's Plugin: a *PluginClient. The plugin never
// dials back, so the broker is not used.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &PluginClient{client: pb.NewPluginClient(c)}, nil
}
