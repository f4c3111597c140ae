// Package transport carries the receiver wire protocol (receiver/wire) over
// four kinds of channel behind one interface: a unix socket, TCP with
// mutual TLS 1.3 pinned to one issuer, vsock, and one byte stream (a
// virtio-serial character device). The custodian dials; the receiver
// listens and serves each accepted connection with a wireserver.Server.
//
// The unix socket, the byte stream and vsock do not authenticate the peer
// cryptographically; they are refused unless the configuration declares
// them host-only (HostOnly), and each still checks what the kernel can
// tell about the peer (uid for unix sockets, context id for vsock).
package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Transport is one configured channel. Dial returns a connection the caller
// owns and must close. Listen returns a Listener the caller owns and must
// close (wireserver.Server.Serve closes the listeners it serves).
type Transport interface {
	Dial(ctx context.Context) (io.ReadWriteCloser, error)
	Listen(ctx context.Context) (Listener, error)
	// String names the kind and address, for logs.
	String() string
}

// Listener accepts authenticated connections. Accept returns when a peer
// that passed every check is connected, when ctx ends (ctx's error) or when
// the listener is closed (net.ErrClosed); peers that fail a check are
// closed inside Accept and never returned. Close is safe to call twice.
type Listener interface {
	// Accept and Close are the method set of wireserver.Listener, which
	// a Listener satisfies; it is spelled out here so that dialing (the
	// custodian's side of this package) links no wire server.
	Accept(ctx context.Context) (io.ReadWriteCloser, error)
	Close() error
	// Addr names the listening address, for logs.
	Addr() string
}

// Errors callers branch on.
var (
	// ErrNotHostOnly: an unauthenticated channel (unix, stream, vsock) was
	// configured without HostOnly.
	ErrNotHostOnly = errors.New("transport: unauthenticated channel not declared host-only")
	// ErrConfig: a transport configuration is incomplete or inconsistent.
	ErrConfig = errors.New("transport: invalid configuration")
	// ErrPeerRefused: the peer failed a check (uid, context id, certificate).
	ErrPeerRefused = errors.New("transport: peer refused")
)

// PeerError names the check a peer failed. It matches ErrPeerRefused.
type PeerError struct {
	Check string // e.g. "peer uid", "peer context id", "peer certificate"
	Peer  string // what the peer presented
	Want  string // what was required
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("transport: peer refused: %s is %s, want %s", e.Check, e.Peer, e.Want)
}

// Is makes errors.Is(err, ErrPeerRefused) true.
func (e *PeerError) Is(target error) bool { return target == ErrPeerRefused }

// requireHostOnly is the gate for channels without peer authentication.
func requireHostOnly(kind string, hostOnly bool) error {
	if !hostOnly {
		return fmt.Errorf("%w: %s has no peer authentication; set host_only only if nothing but the host can reach it",
			ErrNotHostOnly, kind)
	}
	return nil
}

// deadliner is implemented by listeners and connections whose blocking
// calls can be interrupted by a deadline.
type deadliner interface{ SetDeadline(time.Time) error }

// longAgo is a deadline in the past: it interrupts a blocked call at once.
var longAgo = time.Unix(1, 0)

// withCtx runs f, interrupting it through d's deadline when ctx ends. The
// watcher goroutine is joined before withCtx returns; the deadline is
// cleared afterwards. If ctx ended and f failed, ctx's error is returned.
func withCtx(ctx context.Context, d deadliner, f func() error) error {
	if ctx.Done() == nil {
		return f()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
			_ = d.SetDeadline(longAgo)
		case <-done:
		}
	})
	err := f()
	close(done)
	wg.Wait()
	if ctx.Err() != nil {
		_ = d.SetDeadline(time.Time{})
		if err != nil {
			return ctx.Err()
		}
	}
	return err
}
