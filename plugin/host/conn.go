package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// Conn is one ACP connection named to the plugin. It is closed (and its
// bindings fenced) when the ACP connection ends or Close is called.
type Conn struct {
	plugin contract.Plugin
	asc    *acp.AgentSideConnection
	id     string

	closeOnce sync.Once
	closed    chan struct{}
	done      chan struct{}
}

// Connect names asc to the plugin: the requests of the plugin's plans, and
// `_tether/attach`, go out on asc itself, for the sessions of this
// connection. principal is the identity the host authenticated for the
// connection (ACP authenticate or the host's own configuration); it is the
// only identity the plugin compares with tuple.owner. The Conn closes
// itself when asc ends.
func (p *Plugin) Connect(ctx context.Context, asc *acp.AgentSideConnection, principal string) (*Conn, error) {
	return connect(ctx, p.impl, asc, principal)
}

func connect(ctx context.Context, plugin contract.Plugin, asc *acp.AgentSideConnection, principal string) (*Conn, error) {
	id, err := plugin.Connect(ctx, principal)
	if err != nil {
		return nil, fmt.Errorf("plugin connect: %w", err)
	}
	c := &Conn{plugin: plugin, asc: asc, id: id, closed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		select {
		case <-asc.Done():
			_ = c.disconnect()
		case <-c.closed:
		}
	}()
	return c, nil
}

// ID is the plugin's name for the connection.
func (c *Conn) ID() string { return c.id }

// Close tells the plugin the connection is gone (its bindings fence).
// Safe to call twice.
func (c *Conn) Close() error {
	err := c.disconnect()
	<-c.done
	return err
}

func (c *Conn) disconnect() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = c.plugin.Disconnect(ctx, c.id)
	})
	return err
}

// OpenSession reports session/new or session/load with its `_meta`. Hosts
// must report every session before running any tool for it. A bind the
// plugin admits is confirmed with `_tether/attach` on this connection
// before OpenSession returns. A refusal is an error carrying a tether code
// (acperr.CodeOf) that the host returns to the ACP client as is (see
// acperr.NewError).
func (c *Conn) OpenSession(ctx context.Context, m Method, sessionID string, meta map[string]any) (SessionStatus, error) {
	method := map[Method]contract.Method{MethodNew: contract.MethodNew, MethodLoad: contract.MethodLoad}[m]
	st, err := c.plugin.OpenSession(ctx, contract.OpenRequest{ConnID: c.id, SessionID: sessionID, Method: method, Meta: meta}, c.attach)
	if err != nil {
		return SessionStatus{}, err
	}
	return sessionStatus(st), nil
}

// attach sends `_tether/attach` for the session being opened (the only
// request the plugin may ask for outside a plan).
func (c *Conn) attach(ctx context.Context, sessionID, tupleSHA256 string) (json.RawMessage, error) {
	raw, err := c.asc.CallExtension(ctx, acpmeta.MethodAttach, acpmeta.AttachRequest{SessionID: sessionID, TupleSHA256: tupleSHA256})
	return raw, c.transport(err)
}

// transport marks err as the connection's loss once the connection is
// done: its fate is unknown.
func (c *Conn) transport(err error) error {
	if err == nil {
		return nil
	}
	select {
	case <-c.asc.Done():
		return fmt.Errorf("%w: ACP connection closed: %v", contract.ErrTransport, err)
	default:
		return err
	}
}

// Status reports a session's binding state.
func (c *Conn) Status(ctx context.Context, sessionID string) (SessionStatus, error) {
	st, err := c.plugin.Status(ctx, c.id, sessionID)
	if err != nil {
		return SessionStatus{}, err
	}
	return sessionStatus(st), nil
}

var bindingStates = map[contract.State]BindingState{contract.Unbound: Unbound, contract.Pending: Pending,
	contract.Bound: Bound, contract.Fenced: Fenced}

func sessionStatus(st contract.Status) SessionStatus {
	return SessionStatus{SessionID: st.SessionID, State: bindingStates[st.State], TupleSHA256: st.TupleSHA256,
		LeaseNotAfter: st.LeaseNotAfter, GrantGeneration: st.GrantGeneration, Code: string(st.Code), Message: st.Message}
}

// AllowHostTool asks the plugin's ToolPolicy whether the host may run its
// own tool for the session. nil means allowed; a refusal is a *errcode.Error;
// any failure to ask (plugin gone) is an error too, so a host that treats
// every non-nil result as "refuse" fails closed.
func (c *Conn) AllowHostTool(ctx context.Context, sessionID, tool string, kind HostToolKind) error {
	k := map[HostToolKind]contract.HostToolKind{HostFilesystem: contract.HostFilesystem,
		HostProcess: contract.HostProcess, HostOther: contract.HostOther}[kind]
	err := c.plugin.ToolPolicy(ctx, c.id, sessionID, tool, k)
	var we *errcode.Error
	if err != nil && !errors.As(err, &we) {
		return fmt.Errorf("tool policy for %q: %w", tool, err)
	}
	return err
}
