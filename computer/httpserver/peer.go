package httpserver

import (
	"context"
	"net"

	"github.com/tetherdev/tether/computer/api"
)

// PeerPolicy decides which unix-socket peers the daemon admits: uid 0 as
// an admin, and members of Group (primary or supplementary, by the group
// database) as owner "uid:N". Everyone else is refused when they connect.
type PeerPolicy struct {
	// Group is the gid whose members are admitted; nil admits root only.
	Group *uint32
}

// PeerListener is a unix-socket listener that admits only the peers its
// policy admits: Accept reads each connection's SO_PEERCRED, closes and
// audits a refused one, and returns only admitted ones (as *PeerConn).
type PeerListener struct {
	*net.UnixListener
	policy PeerPolicy
	audit  func(AuditRecord)
}

// PeerConn is an admitted unix-socket connection and the caller its peer
// credentials make.
type PeerConn struct {
	net.Conn
	Caller api.Caller
}

var (
	_ net.Listener = (*PeerListener)(nil)
	_ net.Conn     = (*PeerConn)(nil)
)

type peerKey struct{}

// connContext puts an admitted peer's caller in the connection's context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*PeerConn); ok {
		return context.WithValue(ctx, peerKey{}, pc.Caller)
	}
	return ctx
}

// peerCaller returns the caller of an admitted unix-socket peer.
func peerCaller(ctx context.Context) (api.Caller, bool) {
	c, ok := ctx.Value(peerKey{}).(api.Caller)
	return c, ok
}
