package host_test

import (
	"context"
	"fmt"
	"os"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/plugin/host"
)

// hostSession is the Go host of docs/plugin.md ("A Go host in fifteen
// lines"): the lines between the markers are quoted there verbatim, and
// TestDocQuotesHostExample keeps the two equal. A real host splits them
// across its handlers: Load and Connect once per ACP connection,
// OpenSession in session/new and session/load (its error is the ACP
// answer), AllowHostTool before each of its own tools.
func hostSession(ctx context.Context, agent acp.Agent, pluginPath, pluginSHA256, principal, sessionID string, meta map[string]any) error {
	// doc:begin
	p, err := host.Load(ctx, pluginPath, pluginSHA256) // hash, start, handshake over mTLS
	if err != nil {
		return err
	}
	defer p.Close() // kills the plugin: every binding ends with it
	conn, err := p.Connect(ctx, acp.NewAgentSideConnection(agent, os.Stdout, os.Stdin), principal)
	if err != nil {
		return err
	}
	if _, err := conn.OpenSession(ctx, host.MethodNew, sessionID, meta); err != nil {
		return err // a refused bind: answer session/new with it (acperr.NewError)
	}
	if err := conn.AllowHostTool(ctx, sessionID, "bash", host.HostProcess); err != nil {
		return err // refused, or the plugin is gone: never run bash on the host
	}
	// doc:end
	return nil
}

// ExampleLoad loads tether-plugin, hands it the host's ACP connection and
// reports a session. It is compiled, not run: it needs an ACP client on
// stdin/stdout and an installed plugin.
func ExampleLoad() {
	var agent acp.Agent      // the host's own ACP agent
	meta := map[string]any{} // session/new's _meta, carrying "tether/bind"
	err := hostSession(context.Background(), agent, "path/to/tether-plugin",
		"<the plugin's hex SHA-256>", "alice", "sess-1", meta)
	fmt.Println(err)
}
