//go:build !linux

package host

import (
	"context"

	acp "github.com/coder/acp-go-sdk"
)

// This file is the package on systems other than Linux: the same API,
// where Load fails with ErrUnimplemented (the plugin runs from a sealed
// memfd, which only Linux has), so no Plugin or Conn can exist and every
// method says the same.

// Plugin is a running, verified tether-plugin process (Linux only).
type Plugin struct{}

// Conn is one ACP connection named to the plugin (Linux only).
type Conn struct{}

// Load returns ErrUnimplemented.
func Load(ctx context.Context, path, sha256Hex string, opts ...Option) (*Plugin, error) {
	return nil, ErrUnimplemented
}

// Connect returns ErrUnimplemented.
func (p *Plugin) Connect(ctx context.Context, asc *acp.AgentSideConnection, principal string) (*Conn, error) {
	return nil, ErrUnimplemented
}

// Close returns ErrUnimplemented.
func (p *Plugin) Close() error { return ErrUnimplemented }

// Exited reports true: no plugin runs.
func (p *Plugin) Exited() bool { return true }

// ID returns "".
func (c *Conn) ID() string { return "" }

// Close returns ErrUnimplemented.
func (c *Conn) Close() error { return ErrUnimplemented }

// OpenSession returns ErrUnimplemented.
func (c *Conn) OpenSession(ctx context.Context, m Method, sessionID string, meta map[string]any) (SessionStatus, error) {
	return SessionStatus{}, ErrUnimplemented
}

// Status returns ErrUnimplemented.
func (c *Conn) Status(ctx context.Context, sessionID string) (SessionStatus, error) {
	return SessionStatus{}, ErrUnimplemented
}

// AllowHostTool returns ErrUnimplemented: a host that treats every error
// as a refusal runs none of its own tools.
func (c *Conn) AllowHostTool(ctx context.Context, sessionID, tool string, kind HostToolKind) error {
	return ErrUnimplemented
}

// ReadTextFile returns ErrUnimplemented.
func (c *Conn) ReadTextFile(ctx context.Context, sessionID string, o CallOptions, path string, line, limit int) (ReadResult, error) {
	return ReadResult{}, ErrUnimplemented
}

// WriteTextFile returns ErrUnimplemented.
func (c *Conn) WriteTextFile(ctx context.Context, sessionID string, o CallOptions, path, content string) (WriteResult, error) {
	return WriteResult{}, ErrUnimplemented
}

// EditTextFile returns ErrUnimplemented.
func (c *Conn) EditTextFile(ctx context.Context, sessionID string, o CallOptions, path, oldText, newText string) (EditResult, error) {
	return EditResult{}, ErrUnimplemented
}

// ListDirectory returns ErrUnimplemented.
func (c *Conn) ListDirectory(ctx context.Context, sessionID string, o CallOptions, path string) (ListResult, error) {
	return ListResult{}, ErrUnimplemented
}

// RunCommand returns ErrUnimplemented.
func (c *Conn) RunCommand(ctx context.Context, sessionID string, o CallOptions, cmd Command) (CommandResult, error) {
	return CommandResult{}, ErrUnimplemented
}

// Glob returns ErrUnimplemented.
func (c *Conn) Glob(ctx context.Context, sessionID string, o CallOptions, pattern, dir string) (GlobResult, error) {
	return GlobResult{}, ErrUnimplemented
}

// Grep returns ErrUnimplemented.
func (c *Conn) Grep(ctx context.Context, sessionID string, o CallOptions, pattern, dir string, g GrepOptions) (GrepResult, error) {
	return GrepResult{}, ErrUnimplemented
}
