package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/receiver/internal/ratelog"
	"github.com/tetherdev/tether/receiver/wire"
)

// DefaultHelloTimeout is how long a listener waits for a peer's
// ClientHello before it drops the connection.
const DefaultHelloTimeout = time.Second

// maxHandshakesPerPeer bounds the handshakes one peer (wire.PeerOf) has
// in progress at once, so one peer cannot take every handshake slot.
const maxHandshakesPerPeer = 4

// Reasons a TLS listener refuses a connection (aggregated in its log).
const (
	refusedHandshakes = "handshake limit"
	refusedPeer       = "per-peer handshake limit"
	refusedNoHello    = "no ClientHello in time"
	refusedHandshake  = "handshake failed"
)

func (t TLS) helloTimeout() time.Duration {
	if t.HelloTimeout > 0 {
		return t.HelloTimeout
	}
	return DefaultHelloTimeout
}

// tlsListener runs server handshakes on the connections of ln and hands
// the verified ones to Accept.
type tlsListener struct {
	ln      net.Listener
	cfg     *tls.Config
	timeout time.Duration // whole handshake
	hello   time.Duration // until the ClientHello
	refused *ratelog.Log
	conns   chan *tls.Conn
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	once    sync.Once
	wg      sync.WaitGroup // accept loop and handshakes

	mu      sync.Mutex
	pending int            // handshakes in progress
	byPeer  map[string]int // handshakes in progress per peer
}

func newTLSListener(ln net.Listener, cfg *tls.Config, timeout, hello time.Duration, log *slog.Logger) *tlsListener {
	l := &tlsListener{ln: ln, cfg: cfg, timeout: timeout, hello: hello,
		refused: ratelog.New(log, "transport: tls peer refused", 0),
		conns:   make(chan *tls.Conn), byPeer: map[string]int{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Go(l.acceptLoop)
	return l
}

// Addr is the listening address (with the port the kernel chose for :0).
func (l *tlsListener) Addr() string { return l.ln.Addr().String() }

// acceptLoop accepts raw connections and starts a handshake for each one
// within the limits; it never waits for a slot.
func (l *tlsListener) acceptLoop() {
	b := backoff.New(5*time.Millisecond, time.Second)
	accept := func(context.Context) (net.Conn, error) { return l.ln.Accept() }
	stop := func(error) error { return l.ctx.Err() }
	warn := func(err error, _ time.Duration) { l.refused.Refused("accept failed", "", err) }
	for {
		raw, err := backoff.Accept(l.ctx, b, accept, stop, warn)
		if err != nil {
			return
		}
		peer := wire.PeerOf(raw)
		if reason := l.begin(peer); reason != "" {
			l.refused.Refused(reason, peer, nil)
			_ = raw.Close()
			continue
		}
		l.wg.Go(func() { l.handshake(raw, peer) })
	}
}

// begin takes a handshake slot for peer, or names the limit reached.
func (l *tlsListener) begin(peer string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.pending >= maxHandshakes:
		return refusedHandshakes
	case l.byPeer[peer] >= maxHandshakesPerPeer:
		return refusedPeer
	}
	l.pending++
	l.byPeer[peer]++
	return ""
}

// end gives peer's handshake slot back.
func (l *tlsListener) end(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending--
	if l.byPeer[peer]--; l.byPeer[peer] <= 0 {
		delete(l.byPeer, peer)
	}
}

// handshake runs the server handshake of raw: the ClientHello must come
// within the hello timeout (the raw connection's deadline, lifted when it
// has arrived), the whole handshake within the handshake timeout. The
// slot is given back before the connection is handed to Accept.
func (l *tlsListener) handshake(raw net.Conn, peer string) {
	var hello atomic.Bool
	cfg := l.cfg.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		hello.Store(true)
		_ = raw.SetDeadline(time.Time{})
		return nil, nil
	}
	_ = raw.SetDeadline(time.Now().Add(l.hello))
	c := tls.Server(raw, cfg)
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	err := c.HandshakeContext(ctx)
	cancel()
	l.end(peer)
	if err != nil {
		reason := refusedHandshake
		if !hello.Load() {
			reason = refusedNoHello
		}
		l.refused.Refused(reason, peer, err)
		_ = c.Close()
		return
	}
	select {
	case l.conns <- c:
	case <-l.ctx.Done():
		_ = c.Close()
	}
}

// Accept returns the next verified connection.
func (l *tlsListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening, abandons pending handshakes, joins the
// listener's goroutines and logs the refusals still counted.
func (l *tlsListener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.ln.Close()
		l.wg.Wait()
		l.refused.Close()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
