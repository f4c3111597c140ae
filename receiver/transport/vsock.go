package transport

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/mdlayher/vsock"

	"github.com/tetherdev/tether/receiver/internal/ratelog"
)

// HostCID is the context id of the host as seen from a guest.
const HostCID = vsock.Host

// Vsock is an AF_VSOCK stream. The hypervisor vouches for the peer's
// context id but nothing authenticates the process behind it, so HostOnly
// must be set; the listener also accepts only PeerCID, so processes inside
// the guest itself (loopback, the guest's own CID) are refused.
type Vsock struct {
	// CID is the context id to dial (the receiver's guest).
	CID uint32
	// Port is the vsock port to dial or listen on.
	Port uint32
	// PeerCID is the only context id Listen accepts; 0 means HostCID.
	PeerCID uint32
	// HostOnly declares that only the host can reach the port. Required.
	HostOnly bool
	// Log receives refused peers on Listen; nil discards.
	Log *slog.Logger
}

var _ Transport = Vsock{}

func (v Vsock) String() string { return fmt.Sprintf("vsock:%d:%d", v.CID, v.Port) }

func (v Vsock) check() error {
	if err := requireHostOnly("vsock", v.HostOnly); err != nil {
		return err
	}
	if v.Port == 0 {
		return fmt.Errorf("%w: vsock port 0", ErrConfig)
	}
	return nil
}

// Dial connects to CID:Port.
func (v Vsock) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	if err := v.check(); err != nil {
		return nil, err
	}
	if v.CID == 0 {
		return nil, fmt.Errorf("%w: vsock dial needs a context id", ErrConfig)
	}
	c, err := vsock.DialContext(ctx, v.CID, v.Port, nil)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", v, err)
	}
	return c, nil
}

// Listen listens on Port on every local context id.
func (v Vsock) Listen(ctx context.Context) (Listener, error) {
	if err := v.check(); err != nil {
		return nil, err
	}
	ln, err := vsock.Listen(v.Port, nil)
	if err != nil {
		return nil, fmt.Errorf("transport: listen vsock port %d: %w", v.Port, err)
	}
	peer := v.PeerCID
	if peer == 0 {
		peer = HostCID
	}
	log := v.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &vsockListener{ln: ln, peer: peer, refused: ratelog.New(log, "transport: vsock peer refused", 0)}, nil
}

type vsockListener struct {
	ln      *vsock.Listener
	peer    uint32
	refused *ratelog.Log // refused peers, aggregated
	once    sync.Once
}

func (l *vsockListener) Addr() string { return "vsock:" + l.ln.Addr().String() }

// Accept returns the next connection from the allowed context id.
func (l *vsockListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	for {
		var c net.Conn
		err := withCtx(ctx, l.ln, func() (err error) {
			c, err = l.ln.Accept()
			return err
		})
		if err != nil {
			return nil, err
		}
		if err := checkPeerCID(c.RemoteAddr(), l.peer); err != nil {
			l.refused.Refused("peer context id", c.RemoteAddr().String(), err)
			_ = c.Close()
			continue
		}
		return c, nil
	}
}

// checkPeerCID accepts only a vsock address with context id want.
func checkPeerCID(a net.Addr, want uint32) error {
	va, ok := a.(*vsock.Addr)
	if !ok {
		return &PeerError{Check: "peer address", Peer: fmt.Sprintf("%T", a), Want: "a vsock address"}
	}
	if va.ContextID != want {
		return &PeerError{Check: "peer context id", Peer: strconv.FormatUint(uint64(va.ContextID), 10),
			Want: strconv.FormatUint(uint64(want), 10)}
	}
	return nil
}

// Close stops listening; safe to call twice.
func (l *vsockListener) Close() error {
	var err error
	l.once.Do(func() { err = l.ln.Close(); l.refused.Close() })
	return err
}
