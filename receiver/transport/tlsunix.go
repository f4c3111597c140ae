package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"path/filepath"
)

// TLS over a unix socket: a computer whose receiver lives in its own
// network namespace (docs/decisions.md) is reached through a socket in
// the computer's directory, with the same mutual TLS 1.3 pinned to the
// computer's CA as over TCP. The kernel's word on the peer (SO_PEERCRED)
// is checked first, on both sides: a peer whose uid is not allowed never
// reaches a handshake.

// checkUnixPath checks Path and SocketMode like Unix.check.
func (t TLS) checkUnixPath() error {
	if !filepath.IsAbs(t.Path) || filepath.Clean(t.Path) != t.Path {
		return fmt.Errorf("%w: tls unix path %q is not absolute and clean", ErrConfig, t.Path)
	}
	if t.SocketMode&^0o777 != 0 {
		return fmt.Errorf("%w: tls unix socket mode %#o has bits beyond 0777", ErrConfig, t.SocketMode)
	}
	return nil
}

// unixSide is the Unix transport with t's socket settings, whose checks
// and peer uid list the TLS socket shares.
func (t TLS) unixSide() Unix {
	return Unix{Path: t.Path, HostOnly: true, Mode: t.SocketMode, PeerUIDs: t.PeerUIDs, Log: t.Log}
}

// dialUnix connects to the socket, checks the listener's uid
// (SO_PEERCRED), then runs the client handshake bounded by ctx.
func (t TLS) dialUnix(ctx context.Context, cfg *tls.Config) (io.ReadWriteCloser, error) {
	if err := t.checkUnixPath(); err != nil {
		return nil, err
	}
	raw, err := t.unixSide().Dial(ctx)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw.(net.Conn), cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("transport: dial tls+unix %s: %w", t.Path, err)
	}
	return c, nil
}

// listenUnix binds the socket as Unix.Listen does (safe directory, stale
// socket replaced, mode set before listening) and returns a net.Listener
// whose Accept drops peers with a uid not allowed before any handshake.
func (t TLS) listenUnix(ctx context.Context) (net.Listener, error) {
	if err := t.checkUnixPath(); err != nil {
		return nil, err
	}
	l, err := t.unixSide().Listen(ctx)
	if err != nil {
		return nil, err
	}
	return &peerCheckedListener{ul: l.(*unixListener)}, nil
}

// peerCheckedListener adapts a unixListener (which checks the peer uid)
// to net.Listener for the TLS accept loop.
type peerCheckedListener struct {
	ul *unixListener
}

var _ net.Listener = (*peerCheckedListener)(nil)

// Accept returns the next connection whose peer uid is allowed.
func (l *peerCheckedListener) Accept() (net.Conn, error) {
	c, err := l.ul.Accept(context.Background())
	if err != nil {
		return nil, err
	}
	return unixConn{c.(*net.UnixConn)}, nil
}

// unixConn never reports a nil remote address (an unnamed peer socket
// has none), so the TLS listener can log it.
type unixConn struct{ *net.UnixConn }

// RemoteAddr is the peer's address, or "unix:@unnamed".
func (c unixConn) RemoteAddr() net.Addr {
	if a := c.UnixConn.RemoteAddr(); a != nil {
		return a
	}
	return &net.UnixAddr{Name: "@unnamed", Net: "unix"}
}

// Close stops listening and removes the socket if it is still ours.
func (l *peerCheckedListener) Close() error { return l.ul.Close() }

// Addr is the socket's address.
func (l *peerCheckedListener) Addr() net.Addr { return l.ul.ln.Addr() }
