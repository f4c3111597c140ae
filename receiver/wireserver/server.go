package wireserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/internal/ratelog"
	"github.com/tetherdev/tether/receiver/wire"
)

// Server defaults.
const (
	// DefaultMaxInFlight bounds the requests one connection may have
	// running at once; one more is answered CodeUnavailable, unrun.
	DefaultMaxInFlight = 64
	// DefaultWriteTimeout bounds writing one answer on a connection that
	// supports write deadlines; a peer that stops reading loses the
	// connection instead of holding handlers forever.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultMaxConns bounds the connections one Server serves at once;
	// one more is closed at once, unserved.
	DefaultMaxConns = 64
	// DefaultMaxConnsPerPeer bounds the connections one peer (PeerOf) has
	// served at once; one more is closed at once, unserved.
	DefaultMaxConnsPerPeer = 16
)

// ErrServerClosed is returned by Serve and ServeConn once Shutdown or Close
// has begun, and is the cancellation cause handlers see then.
var ErrServerClosed = errors.New("wire: server closed")

// ErrConnLimit is returned by ServeConn for a connection over MaxConns or
// MaxConnsPerPeer; it was closed unserved.
var ErrConnLimit = errors.New("wire: connection limit reached")

// Listener is what Serve accepts connections from; every transport in
// receiver/transport provides one. Accept returns an established (for TLS:
// authenticated) connection the caller owns; it returns when ctx ends or
// the listener is closed. Close is safe to call more than once.
type Listener interface {
	Accept(ctx context.Context) (io.ReadWriteCloser, error)
	Close() error
}

// ServerConfig tunes a Server. The zero value is valid.
type ServerConfig struct {
	// MaxFrame bounds frames in both directions; 0 means MaxFrameSize,
	// larger values are refused.
	MaxFrame int
	// MaxInFlight overrides DefaultMaxInFlight when positive.
	MaxInFlight int
	// WriteTimeout overrides DefaultWriteTimeout when positive.
	WriteTimeout time.Duration
	// MaxConns and MaxConnsPerPeer override DefaultMaxConns and
	// DefaultMaxConnsPerPeer when positive.
	MaxConns, MaxConnsPerPeer int
	// Log receives protocol violations and handler failures (the peer only
	// ever sees a generic message for the latter), and refused connections,
	// aggregated (receiver/internal/ratelog). Nil discards.
	Log *slog.Logger
}

// Server serves the receiver side of the protocol: it reads frames, runs
// each request on its own goroutine through the Handler with a context that
// ends at the request's deadline or when the connection closes, and writes
// answers one at a time. A framing or protocol violation closes the
// connection after a notice naming it.
type Server struct {
	h            Handler
	limit        int
	maxInFlight  int
	writeTimeout time.Duration
	maxConns     int
	maxPerPeer   int
	log          *slog.Logger
	refused      *ratelog.Log

	base context.Context // cancelled by Close, or by Shutdown when its ctx ends
	stop context.CancelCauseFunc

	mu        sync.Mutex
	draining  bool
	conns     map[*serverConn]struct{}
	perPeer   map[string]int
	listeners map[Listener]struct{}

	handlers sync.WaitGroup // running handlers of every connection
	loops    sync.WaitGroup // ServeConn and Serve calls
	idleOnce sync.Once
	idle     chan struct{} // closed once draining and no handler runs
}

// NewServer returns a server for h. Shut it down with Shutdown or Close.
func NewServer(h Handler, cfg ServerConfig) (*Server, error) {
	if h == nil {
		return nil, errors.New("wire: NewServer: nil handler")
	}
	limit, err := wire.FrameLimit(cfg.MaxFrame)
	if err != nil {
		return nil, err
	}
	s := &Server{
		h: h, limit: limit, maxInFlight: DefaultMaxInFlight, writeTimeout: DefaultWriteTimeout,
		maxConns: positiveOr(cfg.MaxConns, DefaultMaxConns), maxPerPeer: positiveOr(cfg.MaxConnsPerPeer, DefaultMaxConnsPerPeer),
		log: cfg.Log, conns: make(map[*serverConn]struct{}), perPeer: make(map[string]int),
		listeners: make(map[Listener]struct{}), idle: make(chan struct{}),
	}
	if cfg.MaxInFlight > 0 {
		s.maxInFlight = cfg.MaxInFlight
	}
	if cfg.WriteTimeout > 0 {
		s.writeTimeout = cfg.WriteTimeout
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.refused = ratelog.New(s.log, "wire: connection refused", 0)
	s.base, s.stop = context.WithCancelCause(context.Background())
	return s, nil
}

// Serve serves h on conn with the default configuration until the
// connection ends or ctx is cancelled, then closes conn.
func Serve(ctx context.Context, conn io.ReadWriteCloser, h Handler) error {
	s, err := NewServer(h, ServerConfig{})
	if err != nil {
		_ = conn.Close()
		return err
	}
	defer s.Close()
	return s.ServeConn(ctx, conn)
}

// ServeConn serves one connection, which it owns and closes, until the peer
// closes it (nil), a violation ends it (the violation's error), ctx is
// cancelled (ctx's cause) or the server shuts down (ErrServerClosed). A
// connection over MaxConns or MaxConnsPerPeer is closed at once
// (ErrConnLimit). It
// returns only after every handler it started has returned. After Shutdown
// or Close it sends the shutdown notice, closes conn and returns
// ErrServerClosed at once.
func (s *Server) ServeConn(ctx context.Context, conn io.ReadWriteCloser) error {
	sc, err := s.track(ctx, conn)
	if err != nil {
		return err
	}
	defer s.untrack(sc)
	return sc.serve()
}

// Serve accepts connections from l and serves each on its own goroutine
// until ctx ends (ctx's error) or the server shuts down (ErrServerClosed).
// The server owns l from then on and closes it. Serve returns after every
// connection it accepted has ended.
func (s *Server) Serve(ctx context.Context, l Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.loops.Add(1)
	s.mu.Unlock()
	defer s.loops.Done()
	defer func() { _ = l.Close() }()

	var children sync.WaitGroup
	defer children.Wait()
	return s.acceptLoop(ctx, l, &children)
}

func (s *Server) acceptLoop(ctx context.Context, l Listener, children *sync.WaitGroup) error {
	b := backoff.New(5*time.Millisecond, time.Second)
	stop := func(error) error { return s.stopped(ctx) }
	warn := func(err error, d time.Duration) {
		s.log.Warn("wire: accept failed; retrying", "err", err, "backoff", d)
	}
	for {
		conn, err := backoff.Accept(ctx, b, l.Accept, stop, warn)
		if err != nil {
			return err
		}
		sc, err := s.track(ctx, conn)
		if errors.Is(err, ErrConnLimit) {
			continue
		}
		if err != nil {
			return err
		}
		children.Go(func() {
			defer s.untrack(sc)
			if err := sc.serve(); err != nil && !errors.Is(err, ErrServerClosed) {
				s.log.Info("wire: connection ended", "err", err)
			}
		})
	}
}

// stopped reports why Serve must stop: the server is draining or closed,
// or ctx has ended. Nil means the accept error was transient.
func (s *Server) stopped(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.draining:
		return ErrServerClosed
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return nil
}

// Shutdown stops accepting, tells every connection the receiver is shutting
// down (notice CodeUnavailable), answers any later request CodeUnavailable
// without running it, and waits for the requests in flight to be answered;
// then it closes every connection. If ctx ends first, the handlers still
// running are cancelled (cause ErrServerClosed), Shutdown waits for them to
// return, and returns ctx's error. Shutdown is idempotent: later calls wait
// for the same completion and return nil.
func (s *Server) Shutdown(ctx context.Context) error {
	conns := s.beginDrain()
	var notices sync.WaitGroup
	for _, sc := range conns {
		notices.Go(func() { sc.notice(errcode.CodeUnavailable, "receiver shutting down") })
	}
	notices.Wait()
	var err error
	select {
	case <-s.idle:
	case <-ctx.Done():
		err = ctx.Err()
		s.stop(ErrServerClosed)
		<-s.idle
	}
	s.stop(ErrServerClosed)
	s.loops.Wait()
	s.refused.Close()
	return err
}

// Close stops the server at once: listeners and connections are closed and
// running handlers are cancelled (cause ErrServerClosed). It waits for
// every handler and connection loop to return. Safe to call more than once.
func (s *Server) Close() error {
	s.beginDrain()
	s.stop(ErrServerClosed)
	<-s.idle
	s.loops.Wait()
	s.refused.Close()
	return nil
}

// beginDrain marks the server draining (once), closes its listeners and
// returns the connections that must hear the shutdown notice (none on
// later calls).
func (s *Server) beginDrain() []*serverConn {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return nil
	}
	s.draining = true
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	ls := s.listeners
	s.listeners = nil
	s.mu.Unlock()
	for l := range ls {
		_ = l.Close()
	}
	go func() { // joined: Shutdown and Close wait on s.idle
		s.handlers.Wait()
		s.idleOnce.Do(func() { close(s.idle) })
	}()
	return conns
}

// track registers a new connection, or refuses it: closed at once when it
// is over MaxConns or its peer's MaxConnsPerPeer (never waiting for a
// slot), with the shutdown notice once draining.
func (s *Server) track(ctx context.Context, conn io.ReadWriteCloser) (*serverConn, error) {
	peer := wire.PeerOf(conn)
	s.mu.Lock()
	if reason := s.overLimitLocked(peer); reason != "" && !s.draining {
		s.mu.Unlock()
		s.refused.Refused(reason, peer, nil)
		_ = conn.Close()
		return nil, fmt.Errorf("%w: %s", ErrConnLimit, reason)
	}
	if !s.draining {
		defer s.mu.Unlock()
		sc := newServerConn(s, ctx, conn, peer)
		s.conns[sc] = struct{}{}
		s.perPeer[peer]++
		s.loops.Add(1)
		return sc, nil
	}
	s.mu.Unlock()
	sc := newServerConn(s, context.Background(), conn, peer)
	sc.notice(errcode.CodeUnavailable, "receiver shutting down")
	sc.cancel(ErrServerClosed)
	_ = conn.Close()
	return nil, ErrServerClosed
}

// overLimitLocked names the cap a new connection from peer would break,
// or returns ""; s.mu is held.
func (s *Server) overLimitLocked(peer string) string {
	switch {
	case len(s.conns) >= s.maxConns:
		return fmt.Sprintf("connection limit (%d)", s.maxConns)
	case s.perPeer[peer] >= s.maxPerPeer:
		return fmt.Sprintf("per-peer connection limit (%d)", s.maxPerPeer)
	}
	return ""
}

func (s *Server) untrack(sc *serverConn) {
	s.mu.Lock()
	delete(s.conns, sc)
	if s.perPeer[sc.peer]--; s.perPeer[sc.peer] <= 0 {
		delete(s.perPeer, sc.peer)
	}
	s.mu.Unlock()
	s.loops.Done()
}

func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// admitHandler counts one more running handler, unless draining.
func (s *Server) admitHandler() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.handlers.Add(1)
	return true
}

func violation(err error) error { return fmt.Errorf("closing connection: %w", err) }
