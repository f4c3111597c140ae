package wireserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// serveRaw runs a Server with h on one end of a socketpair and returns a
// raw peer on the other, plus ServeConn's result.
func serveRaw(t *testing.T, h Handler, cfg ServerConfig) (*Server, *rawPeer, net.Conn, <-chan error) {
	t.Helper()
	cc, sc := socktest.Pair(t)
	srv, err := NewServer(h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), sc) }()
	return srv, newRawPeer(t, cc), cc, served
}

func request(id uint64, op wire.Op, args string) []byte {
	return fmt.Appendf(nil, `{"id":%d,"op":%q,"tuple_sha256":%q,"op_key":"k","deadline":%q,"args":%s}`,
		id, op, testDigest, soon().UTC().Format(time.RFC3339Nano), args)
}

// countingHandler counts the requests that reached it.
type countingHandler struct{ n atomic.Int64 }

func (c *countingHandler) Serve(ctx context.Context, req *wire.Request) (any, error) {
	c.n.Add(1)
	return nil, nil
}

// Every framing or protocol violation closes the connection after a notice
// (id 0, invalid) and never reaches the handler.
func TestServerViolationClosesConnection(t *testing.T) {
	cases := map[string]func(p *rawPeer, c net.Conn){
		"oversize frame":  func(p *rawPeer, c net.Conn) { c.Write(hdr(wire.MaxFrameSize + 1)) },
		"zero frame":      func(p *rawPeer, c net.Conn) { c.Write(hdr(0)) },
		"malformed json":  func(p *rawPeer, c net.Conn) { p.sendRaw([]byte(`{"id":1,`)) },
		"unknown op":      func(p *rawPeer, c net.Conn) { p.sendRaw(request(1, "format_disk", `{}`)) },
		"unknown field":   func(p *rawPeer, c net.Conn) { p.sendRaw(request(1, wire.OpStat, `{"path":"x","follow":1}`)) },
		"duplicate key":   func(p *rawPeer, c net.Conn) { p.sendRaw(request(1, wire.OpStat, `{"path":"x","path":"y"}`)) },
		"id zero":         func(p *rawPeer, c net.Conn) { p.sendRaw(request(0, wire.OpStat, `{"path":"x"}`)) },
		"trailing data":   func(p *rawPeer, c net.Conn) { p.sendRaw(append(request(1, wire.OpStat, `{"path":"x"}`), ' ', '1')) },
		"over the config": func(p *rawPeer, c net.Conn) { p.sendRaw([]byte(`{"pad":"` + strings.Repeat("x", 5000) + `"}`)) },
	}
	for name, attack := range cases {
		t.Run(name, func(t *testing.T) {
			h := &countingHandler{}
			_, peer, conn, served := serveRaw(t, h, ServerConfig{MaxFrame: 4096})
			attack(peer, conn)
			var notice wire.Response
			peer.next(&notice)
			if notice.ID != 0 || notice.Error == nil || notice.Error.Code != errcode.CodeInvalid {
				t.Fatalf("notice = %+v, want id 0 invalid", notice)
			}
			peer.expectEOF()
			if err := <-served; !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrProtocol) &&
				!errors.Is(err, wire.ErrFrameTooLarge) && !errors.Is(err, wire.ErrFrameEmpty) {
				t.Fatalf("ServeConn = %v, want the violation", err)
			}
			if h.n.Load() != 0 {
				t.Fatal("the handler ran for a violating frame")
			}
		})
	}
}

// A truncated frame (peer closes mid-frame) ends the connection with
// ErrFrameTruncated.
func TestServerTruncatedFrame(t *testing.T) {
	for name, sent := range map[string][]byte{
		"inside the payload": append(hdr(100), `{"id":1`...),
		"after the header":   hdr(100),
		"inside the header":  {0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			h := &countingHandler{}
			_, _, conn, served := serveRaw(t, h, ServerConfig{})
			conn.Write(sent)
			conn.(*net.UnixConn).CloseWrite()
			if err := <-served; !errors.Is(err, wire.ErrFrameTruncated) {
				t.Fatalf("ServeConn = %v, want ErrFrameTruncated", err)
			}
		})
	}
}

// A second request with an id still in flight is a violation: answers
// would be ambiguous.
func TestServerDuplicateInFlightID(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		<-ctx.Done() // ends when the violation closes the connection
		return nil, ctx.Err()
	})
	_, peer, _, served := serveRaw(t, h, ServerConfig{})
	peer.sendRaw(request(5, wire.OpAttach, `{}`))
	peer.sendRaw(request(5, wire.OpAttach, `{}`))
	var notice wire.Response
	peer.next(&notice)
	if notice.ID != 0 || notice.Error.Code != errcode.CodeInvalid || !strings.Contains(notice.Error.Message, "already in flight") {
		t.Fatalf("notice %+v", notice)
	}
	if err := <-served; !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("ServeConn = %v", err)
	}
}

// Field faults, expired deadlines and the in-flight bound are answered
// without running the handler and without closing the connection.
func TestServerRefusalsKeepConnection(t *testing.T) {
	block, blocking := make(chan struct{}), make(chan struct{})
	defer close(block)
	var ran atomic.Int64
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		ran.Add(1)
		if req.OpKey == "block" {
			close(blocking)
			select {
			case <-block:
			case <-ctx.Done():
			}
		}
		return nil, nil
	})
	_, peer, _, _ := serveRaw(t, h, ServerConfig{MaxInFlight: 1})
	past := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	blocker := strings.Replace(string(request(1, wire.OpAttach, `{}`)), `"op_key":"k"`, `"op_key":"block"`, 1)
	peer.sendRaw([]byte(blocker))
	cases := []struct {
		payload string
		want    errcode.Code
	}{
		{string(request(2, wire.OpRead, `{"path":"x","line":-1}`)), errcode.CodeInvalid},
		{strings.Replace(string(request(3, wire.OpAttach, `{}`)), testDigest, "nope", 1), errcode.CodeInvalid},
		{fmt.Sprintf(`{"id":4,"op":"attach","tuple_sha256":%q,"op_key":"k","deadline":%q,"args":{}}`, testDigest, past), errcode.CodeTimeout},
		{string(request(5, wire.OpAttach, `{}`)), errcode.CodeUnavailable}, // id 1 holds the only slot
	}
	for _, c := range cases {
		peer.sendRaw([]byte(c.payload))
		var resp wire.Response
		peer.next(&resp)
		if resp.Error == nil || resp.Error.Code != c.want {
			t.Fatalf("%s: answer %+v, want %s", c.payload, resp, c.want)
		}
	}
	<-blocking // its handler runs on its own goroutine: wait for it, not for time
	if got := ran.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1 (only the blocking request)", got)
	}
}

// Handler errors: a wire *Error keeps its code and message; anything else
// is CodeInternal with a generic message (no internals leak); a handler
// that runs past its deadline is answered CodeTimeout.
func TestServerHandlerErrors(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		switch req.OpKey {
		case "denied":
			return nil, fmt.Errorf("policy: %w", errcode.Errorf(errcode.CodeDenied, "op exec not allowed by the grant"))
		case "secret":
			return nil, errors.New("open /etc/shadow: secret detail")
		case "slow":
			<-ctx.Done()
			return nil, ctx.Err()
		case "badcode":
			return nil, &errcode.Error{Code: "invented", Message: "x"}
		}
		return nil, nil
	})
	cl, _ := pair(t, h, ServerConfig{})
	ctx := testCtx(t)
	call := func(key string, dl time.Time) error {
		return cl.Call(ctx, wire.OpAttach, testDigest, key, dl, nil, nil)
	}
	if err := call("denied", soon()); codeOf(err) != errcode.CodeDenied || !strings.Contains(err.Error(), "not allowed by the grant") {
		t.Errorf("denied: %v", err)
	}
	if err := call("secret", soon()); codeOf(err) != errcode.CodeInternal || strings.Contains(err.Error(), "shadow") {
		t.Errorf("internal: %v (must not leak the detail)", err)
	}
	if err := call("badcode", soon()); codeOf(err) != errcode.CodeInternal {
		t.Errorf("code outside the set: %v", err)
	}
	if err := call("slow", time.Now().Add(100*time.Millisecond)); codeOf(err) != errcode.CodeTimeout {
		t.Errorf("slow: %v, want timeout", err)
	}
}

func TestServerAnswerTooLarge(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		return wire.ReadResult{Content: strings.Repeat("a", 5000)}, nil
	})
	cl, _ := pair(t, h, ServerConfig{MaxFrame: 4096})
	err := cl.Call(testCtx(t), wire.OpRead, testDigest, testOpKey, soon(), &wire.ReadArgs{Path: "x"}, nil)
	if codeOf(err) != errcode.CodeTooLarge {
		t.Fatalf("err = %v, want too_large", err)
	}
}

// Graceful shutdown: the request in flight finishes and is answered; a new
// request is refused unavailable and never runs; the client then closes the
// connection itself; Shutdown is idempotent. Each step waits for an event
// (the listener's close marks the drain's start), never for time.
func TestServerShutdownGraceful(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	var ran atomic.Int64
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		if ran.Add(1) == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return wire.StatResult{Type: "file"}, nil
	})
	cl, srv, l := listenerPair(t, h)
	first := make(chan error, 1)
	go func() {
		var res wire.StatResult
		err := cl.Call(testCtx(t), wire.OpStat, testDigest, "k1", soon(), &wire.StatArgs{Path: "x"}, &res)
		if err == nil && res.Type != "file" {
			err = fmt.Errorf("result %+v", res)
		}
		first <- err
	}()
	<-started
	shut := make(chan error, 2)
	go func() { shut <- srv.Shutdown(testCtx(t)) }()
	// Shutdown marks the server draining before it closes its listeners;
	// from then on a call is refused by the server, or unsent once the
	// client has read the notice.
	<-l.closed
	for range 4 {
		err := cl.Call(testCtx(t), wire.OpStat, testDigest, "k2", soon(), &wire.StatArgs{Path: "x"}, nil)
		if codeOf(err) != errcode.CodeUnavailable {
			t.Fatalf("call during shutdown: %v, want unavailable", err)
		}
	}
	if got := ran.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1: a refused request ran", got)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("in-flight call across shutdown: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-cl.Done():
	case <-testCtx(t).Done():
		t.Fatal("the client did not end the connection after the notice and its last answer")
	}
	if !errors.Is(cl.Err(), wireclient.ErrReceiverShutdown) {
		t.Fatalf("client ended with %v, want ErrReceiverShutdown", cl.Err())
	}
	go func() { shut <- srv.Shutdown(testCtx(t)) }()
	if err := <-shut; err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Fatalf("Close after Shutdown: %v", err)
	}
}

// listenerPair is pair served through Serve on a pairListener, whose
// closed channel tells when the server began to drain.
func listenerPair(t *testing.T, h Handler) (*wireclient.Client, *Server, *pairListener) {
	t.Helper()
	l := &pairListener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	srv, err := NewServer(h, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), l) }()
	cc, sc := socktest.Pair(t)
	l.conns <- sc
	cl, err := wireclient.NewClient(cc, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Close()
		srv.Close()
		<-served
	})
	return cl, srv, l
}

// A raw peer sees the server's own refusal for a request that raced the
// notice, and ServeConn after Shutdown refuses at once.
func TestServerRefusesAfterShutdown(t *testing.T) {
	h := &countingHandler{}
	srv, peer, _, served := serveRaw(t, h, ServerConfig{})
	hold := make(chan struct{})
	defer close(hold)
	if err := srv.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var notice wire.Response
	peer.next(&notice)
	if notice.ID != 0 || notice.Error.Code != errcode.CodeUnavailable {
		t.Fatalf("notice %+v, want id 0 unavailable", notice)
	}
	peer.expectEOF()
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ServeConn = %v, want ErrServerClosed", err)
	}
	cc, sc := socktest.Pair(t)
	if err := srv.ServeConn(context.Background(), sc); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ServeConn after Shutdown = %v", err)
	}
	late := newRawPeer(t, cc)
	late.next(&notice)
	if notice.Error.Code != errcode.CodeUnavailable {
		t.Fatalf("late notice %+v", notice)
	}
	late.expectEOF()
	if h.n.Load() != 0 {
		t.Fatal("handler ran after shutdown")
	}
}

// Shutdown whose ctx ends cancels the handlers (cause ErrServerClosed),
// waits for them, and returns ctx's error.
func TestServerShutdownCtxCancelsHandlers(t *testing.T) {
	cause := make(chan error, 1)
	started := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	cl, srv := pair(t, h, ServerConfig{})
	go cl.Call(testCtx(t), wire.OpAttach, testDigest, testOpKey, soon(), nil, nil)
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	select {
	case c := <-cause:
		if !errors.Is(c, ErrServerClosed) {
			t.Fatalf("handler cause %v, want ErrServerClosed", c)
		}
	default:
		t.Fatal("Shutdown returned before the handler did")
	}
}

// Serve with a listener: accepted connections are served, Shutdown closes
// the listener and Serve returns ErrServerClosed after its connections end.
func TestServerServeListener(t *testing.T) {
	l := &pairListener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	srv, _ := NewServer(statHandler, ServerConfig{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), l) }()
	cc, sc := socktest.Pair(t)
	l.conns <- sc
	cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
	defer cl.Close()
	var res wire.StatResult
	if err := cl.Call(testCtx(t), wire.OpStat, testDigest, testOpKey, soon(), &wire.StatArgs{Path: "abc"}, &res); err != nil || res.Size != 3 {
		t.Fatalf("call: %v %+v", err, res)
	}
	if err := srv.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	select {
	case <-l.closed:
	default:
		t.Fatal("listener not closed")
	}
}

type pairListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   atomicOnce
}

type atomicOnce struct{ done atomic.Bool }

func (o *atomicOnce) Do(f func()) {
	if o.done.CompareAndSwap(false, true) {
		f()
	}
}

func (l *pairListener) Accept(ctx context.Context) (ioRWC, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pairListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// afterResult is a result that holds its request's goroutine after the
// answer until released.
type afterResult struct {
	wire.StatResult
	ran, release chan struct{}
}

func (r *afterResult) AfterWrite() {
	close(r.ran)
	<-r.release
}

// TestServerAfterWrite: a handler the server runs sees OwnsGoroutine; a
// result implementing AfterWriter gets the request's goroutine after its
// answer was delivered, while the request no longer counts as in flight
// (Shutdown completes without it). A direct caller never owns a goroutine.
func TestServerAfterWrite(t *testing.T) {
	res := &afterResult{StatResult: wire.StatResult{Type: "file", Size: 7}, ran: make(chan struct{}), release: make(chan struct{})}
	defer close(res.release)
	owned := make(chan bool, 1)
	h := HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
		owned <- OwnsGoroutine(ctx)
		return res, nil
	})
	if OwnsGoroutine(context.Background()) {
		t.Fatal("a bare context claims an owned goroutine")
	}
	cl, srv := pair(t, h, ServerConfig{})
	var got wire.StatResult
	if err := cl.Call(testCtx(t), wire.OpStat, testDigest, testOpKey, soon(), &wire.StatArgs{Path: "x"}, &got); err != nil {
		t.Fatal(err)
	}
	if got != res.StatResult {
		t.Fatalf("answer %+v, want the embedded result %+v", got, res.StatResult)
	}
	if !<-owned {
		t.Fatal("the server's handler goroutine is not marked as owned")
	}
	select {
	case <-res.ran:
	case <-testCtx(t).Done():
		t.Fatal("AfterWrite never ran")
	}
	if err := srv.Shutdown(testCtx(t)); err != nil { // AfterWrite still blocks: not in flight
		t.Fatalf("Shutdown with an AfterWrite running: %v", err)
	}
}
