package host

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	pb "github.com/tetherdev/tether/plugin/proto"
	"github.com/tetherdev/tether/plugin/shared"
	"github.com/tetherdev/tether/receiver/wire"
)

// Conn is one ACP connection handed to the plugin. It is closed (and its
// bindings fenced) when the ACP connection ends or Close is called.
type Conn struct {
	p     *Plugin
	id    string
	calls *callTable

	closeOnce sync.Once
	closed    chan struct{}
	done      chan struct{}
}

// Connect hands asc to the plugin: the plugin's fs/* and terminal/*
// callbacks and `_tether/attach` go out on asc itself, for the sessions of
// this connection. principal is the identity the host authenticated for
// the connection (ACP authenticate or the host's own configuration); it is
// the only identity the plugin compares with tuple.owner.
func (p *Plugin) Connect(ctx context.Context, asc *acp.AgentSideConnection, principal string) (*Conn, error) {
	calls := &callTable{}
	return p.connect(ctx, &ascClient{asc: asc, calls: calls}, asc.Done(), principal, calls)
}

func (p *Plugin) connect(ctx context.Context, client shared.ACPClient, gone <-chan struct{}, principal string, calls *callTable) (*Conn, error) {
	id, err := p.impl.Connect(ctx, client, principal)
	if err != nil {
		return nil, fmt.Errorf("plugin connect: %w", err)
	}
	c := &Conn{p: p, id: id, calls: calls, closed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		select {
		case <-gone:
			c.disconnect()
		case <-c.closed:
		}
	}()
	return c, nil
}

// ID is the plugin's name for the connection.
func (c *Conn) ID() string { return c.id }

// Close tells the plugin the connection is gone (its bindings fence) and
// stops serving it. Safe to call twice.
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
		err = c.p.impl.Disconnect(ctx, c.id)
	})
	return err
}

// Method is the ACP method that opened a session.
type Method = pb.SessionMethod

// The two methods.
const (
	MethodNew  = pb.SessionMethod_SESSION_METHOD_NEW
	MethodLoad = pb.SessionMethod_SESSION_METHOD_LOAD
)

// OpenSession reports session/new or session/load with its `_meta`. Hosts
// must report every session before running any tool for it; a refusal is
// an error carrying a tether code (acpmeta.CodeOf) that the host returns to
// the ACP client as is (see acpmeta.NewError).
func (c *Conn) OpenSession(ctx context.Context, m Method, sessionID string, meta map[string]any) (*pb.SessionStatus, error) {
	var raw []byte
	if meta != nil {
		b, err := json.Marshal(meta)
		if err != nil {
			return nil, wire.Errorf(wire.CodeInvalid, "_meta does not marshal: %v", err)
		}
		raw = b
	}
	return c.p.impl.OpenSession(ctx, &pb.OpenSessionRequest{ConnId: c.id, SessionId: sessionID, Method: m, MetaJson: raw})
}

// Status reports a session's binding state.
func (c *Conn) Status(ctx context.Context, sessionID string) (*pb.SessionStatus, error) {
	return c.p.impl.Status(ctx, &pb.StatusRequest{ConnId: c.id, SessionId: sessionID})
}

// HostToolKind classifies a host's own tool for AllowHostTool.
type HostToolKind = pb.HostToolKind

// The kinds.
const (
	HostFilesystem = pb.HostToolKind_HOST_TOOL_KIND_FILESYSTEM
	HostProcess    = pb.HostToolKind_HOST_TOOL_KIND_PROCESS
	HostOther      = pb.HostToolKind_HOST_TOOL_KIND_OTHER
)

// AllowHostTool asks the plugin's ToolPolicy whether the host may run its
// own tool for the session. nil means allowed; a refusal is a *wire.Error;
// any failure to ask (plugin gone) is an error too, so a host that treats
// every non-nil result as "refuse" fails closed.
func (c *Conn) AllowHostTool(ctx context.Context, sessionID, tool string, kind HostToolKind) error {
	resp, err := c.p.impl.ToolPolicy(ctx, &pb.ToolPolicyRequest{ConnId: c.id, SessionId: sessionID, Tool: tool, Kind: kind})
	switch {
	case err != nil:
		return fmt.Errorf("tool policy for %q: %w", tool, err)
	case !resp.GetAllow():
		code := wire.Code(resp.GetCode())
		if !code.Valid() {
			code = wire.CodeDenied
		}
		return &wire.Error{Code: code, Message: resp.GetMessage()}
	}
	return nil
}

func (c *Conn) tc(t *pb.ToolContext, sessionID string) *pb.ToolContext {
	if t == nil {
		t = &pb.ToolContext{}
	}
	t.ConnId, t.SessionId = c.id, sessionID
	return t
}

// The tool calls. Each runs only in a bound session; t may be nil (its
// op_key retries an earlier request, timeout_ms bounds the call; call_id is
// set here). A refusal is a *wire.Error (acpmeta.CodeOf). If the caller
// cancels ctx, the call is not abandoned: new ACP work for it is refused, a
// running command is killed, and the call returns once that clean-up
// finished, with a *CancelledError (errors.Is(err, ErrCancelled)), or the
// result of work that finished first.

// ReadTextFile runs read_text_file in a bound session.
func (c *Conn) ReadTextFile(ctx context.Context, sessionID string, t *pb.ToolContext, p string, line, limit int32) (*pb.ReadTextFileToolResponse, error) {
	req := &pb.ReadTextFileToolRequest{Ctx: c.tc(t, sessionID), Path: p, Line: line, Limit: limit}
	return invoke(c, ctx, "read_text_file", req.Ctx, c.p.impl.ReadTextFile, req)
}

// WriteTextFile runs write_text_file in a bound session.
func (c *Conn) WriteTextFile(ctx context.Context, sessionID string, t *pb.ToolContext, p, content string) (*pb.WriteTextFileToolResponse, error) {
	req := &pb.WriteTextFileToolRequest{Ctx: c.tc(t, sessionID), Path: p, Content: content}
	return invoke(c, ctx, "write_text_file", req.Ctx, c.p.impl.WriteTextFile, req)
}

// EditTextFile runs edit_text_file in a bound session.
func (c *Conn) EditTextFile(ctx context.Context, sessionID string, t *pb.ToolContext, p, oldText, newText string) (*pb.EditTextFileToolResponse, error) {
	req := &pb.EditTextFileToolRequest{Ctx: c.tc(t, sessionID), Path: p, OldText: oldText, NewText: newText}
	return invoke(c, ctx, "edit_text_file", req.Ctx, c.p.impl.EditTextFile, req)
}

// ListDirectory runs list_directory in a bound session.
func (c *Conn) ListDirectory(ctx context.Context, sessionID string, t *pb.ToolContext, p string) (*pb.ListDirectoryToolResponse, error) {
	req := &pb.ListDirectoryToolRequest{Ctx: c.tc(t, sessionID), Path: p}
	return invoke(c, ctx, "list_directory", req.Ctx, c.p.impl.ListDirectory, req)
}

// RunCommand runs run_command in a bound session; req.Ctx is filled in. A
// cancelled command comes back as a *CancelledError whose Run holds the
// plugin's result (cancelled, the kill's exit, the output so far, the op
// key), returned together with that result.
func (c *Conn) RunCommand(ctx context.Context, sessionID string, req *pb.RunCommandToolRequest) (*pb.RunCommandToolResponse, error) {
	req.Ctx = c.tc(req.Ctx, sessionID)
	resp, err := invoke(c, ctx, "run_command", req.Ctx, c.p.impl.RunCommand, req)
	if err == nil && resp.GetCancelled() {
		return resp, &CancelledError{Tool: "run_command", Cause: context.Cause(ctx), Run: resp}
	}
	return resp, err
}

// Glob runs glob in a bound session.
func (c *Conn) Glob(ctx context.Context, sessionID string, t *pb.ToolContext, pattern, dir string) (*pb.GlobToolResponse, error) {
	req := &pb.GlobToolRequest{Ctx: c.tc(t, sessionID), Pattern: pattern, Dir: dir}
	return invoke(c, ctx, "glob", req.Ctx, c.p.impl.Glob, req)
}

// Grep runs grep in a bound session; req.Ctx is filled in.
func (c *Conn) Grep(ctx context.Context, sessionID string, req *pb.GrepToolRequest) (*pb.GrepToolResponse, error) {
	req.Ctx = c.tc(req.Ctx, sessionID)
	return invoke(c, ctx, "grep", req.Ctx, c.p.impl.Grep, req)
}
