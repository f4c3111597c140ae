// Package conformance is the suite every receiver transport must pass with
// the wire client and server on top: a round trip, 32 concurrent
// multiplexed requests, refusal after shutdown, idempotent shutdown, a
// framing violation closing the connection, and loss of the receiver
// failing calls in flight as fate unknown. A transport's test calls Run
// with a Setup that builds a fresh listener and dialer for each check.
package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// Dial opens one client connection to the listener of the same Setup.
type Dial func(ctx context.Context) (io.ReadWriteCloser, error)

// Setup builds one transport instance for one check: a listener the
// server owns (the suite closes it) and a Dial for the client side. Setup
// registers any other cleanup with t.Cleanup.
type Setup func(t testing.TB) (wireserver.Listener, Dial)

// Digest is the tuple_sha256 the suite sends.
const Digest = "5e0b8b9f1f2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccd"

// Run runs every check against setup, each as a subtest with its own
// transport instance.
func Run(t *testing.T, setup Setup) {
	t.Run("RoundTrip", func(t *testing.T) { roundTrip(t, setup) })
	t.Run("Concurrent32", func(t *testing.T) { concurrent(t, setup, 32) })
	t.Run("RefusalAfterShutdown", func(t *testing.T) { refusalAfterShutdown(t, setup) })
	t.Run("IdempotentShutdown", func(t *testing.T) { idempotentShutdown(t, setup) })
	t.Run("ViolationClosesConnection", func(t *testing.T) { violation(t, setup) })
	t.Run("ReceiverLossIsFateUnknown", func(t *testing.T) { receiverLoss(t, setup) })
}

// env is one server serving one listener, and a client dialled to it.
type env struct {
	srv    *wireserver.Server
	client *wireclient.Client
	served chan error
	// draining is closed when the server closes its listener, which
	// Shutdown and Close do only after marking the server draining: from
	// then on no request the server reads may run.
	draining <-chan struct{}
}

// start serves h on setup's listener and dials a client. Everything is
// closed at cleanup.
func start(t *testing.T, setup Setup, h wireserver.Handler) *env {
	t.Helper()
	l, dial := setup(t)
	srv, err := wireserver.NewServer(h, wireserver.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cl := &closeListener{Listener: l, closed: make(chan struct{})}
	e := &env{srv: srv, served: make(chan error, 1), draining: cl.closed}
	go func() { e.served <- srv.Serve(context.Background(), cl) }()
	t.Cleanup(func() {
		srv.Close()
		<-e.served
	})
	conn, err := dial(ctx(t))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	e.client, err = wireclient.NewClient(conn, wireclient.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.client.Close() })
	return e
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func soon() time.Time { return time.Now().Add(30 * time.Second) }

func codeOf(err error) errcode.Code {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// echo answers stat with the path length as size and the op key as type,
// so each answer is tied to its request.
// Write is answered with the content's size and digest.
var echo = wireserver.HandlerFunc(func(ctx context.Context, req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err != nil {
		return nil, err
	}
	switch a := args.(type) {
	case *wire.StatArgs:
		return wire.StatResult{Type: req.OpKey, Size: int64(len(a.Path))}, nil
	case *wire.WriteArgs:
		return wire.WriteResult{Size: int64(len(a.Content)), SHA256: sha(a.Content)}, nil
	}
	return nil, errcode.Errorf(errcode.CodeDenied, "op %s not served by the conformance handler", req.Op)
})

func call(t *testing.T, c *wireclient.Client, key, path string) (wire.StatResult, error) {
	var res wire.StatResult
	err := c.Call(ctx(t), wire.OpStat, Digest, key, soon(), &wire.StatArgs{Path: path}, &res)
	return res, err
}

func roundTrip(t *testing.T, setup Setup) {
	var seen atomic.Pointer[wire.Request]
	e := start(t, setup, wireserver.HandlerFunc(func(c context.Context, req *wire.Request) (any, error) {
		seen.Store(req)
		return echo(c, req)
	}))
	path := strings.Repeat("é/", 1000) // multi-byte
	res, err := call(t, e.client, "rt-1", path)
	if err != nil {
		t.Fatal(err)
	}
	if res.Type != "rt-1" || res.Size != int64(len(path)) {
		t.Fatalf("answer %+v does not match the request", res)
	}
	if req := seen.Load(); req.TupleSHA256 != Digest || req.Op != wire.OpStat {
		t.Fatalf("receiver saw %+v", req)
	}
	// A large frame (900 KiB of content, every byte value JSON allows)
	// crosses every buffer of the transport intact.
	var b strings.Builder
	for i := 0; b.Len() < 900<<10; i++ {
		b.WriteRune(rune(1 + i%0x7ff))
	}
	content := b.String()
	var wr wire.WriteResult
	err = e.client.Call(ctx(t), wire.OpWrite, Digest, "rt-2", soon(), &wire.WriteArgs{Path: "f", Content: content}, &wr)
	if err != nil {
		t.Fatal(err)
	}
	if wr.Size != int64(len(content)) || wr.SHA256 != sha(content) {
		t.Fatalf("large write arrived as %d bytes %s, sent %d %s", wr.Size, wr.SHA256, len(content), sha(content))
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// concurrent sends n calls at once; every handler waits until all n have
// arrived, which only a multiplexed connection allows.
func concurrent(t *testing.T, setup Setup, n int) {
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	e := start(t, setup, wireserver.HandlerFunc(func(c context.Context, req *wire.Request) (any, error) {
		arrived.Done()
		select {
		case <-all:
		case <-c.Done():
			return nil, errcode.Errorf(errcode.CodeTimeout, "not all %d requests arrived together", n)
		}
		return echo(c, req)
	}))
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key, path := fmt.Sprintf("c-%d", i), strings.Repeat("x", i+1)
			res, err := call(t, e.client, key, path)
			if err == nil && (res.Type != key || res.Size != int64(i+1)) {
				err = fmt.Errorf("call %d got another call's answer %+v", i, res)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// refusalAfterShutdown: during a graceful shutdown the request in flight
// is answered, a new one is refused with CodeUnavailable and never runs,
// and once the last answer is in the client closes the connection itself
// (ErrReceiverShutdown) and refuses every later call unsent.
//
// Every step waits for an event, never for time: a call made after the
// server closed its listener must be refused (the server marks itself
// draining before it closes its listeners), whether the client has read
// the shutdown notice yet or not. A call made after Shutdown returned but
// before the client read the notice is a different race: the receiver may
// already have closed the connection, and the client can only say
// fate_unknown, so the suite waits for the client to end first.
func refusalAfterShutdown(t *testing.T, setup Setup) {
	started, release := make(chan struct{}), make(chan struct{})
	var ran atomic.Int64
	defer func() {
		select {
		case <-release:
		default:
			close(release) // a failed check must not leave the handler blocked
		}
	}()
	e := start(t, setup, wireserver.HandlerFunc(func(c context.Context, req *wire.Request) (any, error) {
		if ran.Add(1) == 1 {
			close(started)
			select {
			case <-release:
			case <-c.Done():
				return nil, c.Err()
			}
		}
		return echo(c, req)
	}))
	first := make(chan error, 1)
	go func() { _, err := call(t, e.client, "in-flight", "x"); first <- err }()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx(t)) }()
	<-e.draining
	for i := range 4 {
		if _, err := call(t, e.client, fmt.Sprintf("late-%d", i), "x"); codeOf(err) != errcode.CodeUnavailable {
			t.Fatalf("call %d during shutdown: %v, want unavailable", i, err)
		}
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1: a refused request ran", n)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("the request in flight was not answered: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-e.client.Done():
	case <-ctx(t).Done():
		t.Fatal("the client did not end the connection after the shutdown notice and its last answer")
	}
	if err := e.client.Err(); !errors.Is(err, wireclient.ErrReceiverShutdown) {
		t.Fatalf("client ended with %v, want ErrReceiverShutdown", err)
	}
	if _, err := call(t, e.client, "after", "x"); codeOf(err) != errcode.CodeUnavailable {
		t.Fatalf("call after shutdown: %v, want unavailable", err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func idempotentShutdown(t *testing.T, setup Setup) {
	e := start(t, setup, echo)
	if _, err := call(t, e.client, "k", "x"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := e.srv.Shutdown(ctx(t)); err != nil {
			t.Fatalf("Shutdown #%d: %v", i+1, err)
		}
	}
	if err := e.srv.Close(); err != nil {
		t.Fatalf("Close after Shutdown: %v", err)
	}
	select {
	case err := <-e.served:
		e.served <- err // for cleanup
		if !errors.Is(err, wireserver.ErrServerClosed) {
			t.Fatalf("Serve = %v, want ErrServerClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
}

// violation sends a frame header declaring more than the limit: the
// receiver answers with a notice and closes the connection it accepted.
// (On a byte stream the host cannot see a close, so the check is on the
// receiver's side: it must call Close on the accepted connection.)
func violation(t *testing.T, setup Setup) {
	l, dial := setup(t)
	wl := &watchListener{Listener: l, closed: make(chan struct{}, 8)}
	var ran atomic.Int64
	srv, _ := wireserver.NewServer(wireserver.HandlerFunc(func(c context.Context, req *wire.Request) (any, error) {
		ran.Add(1)
		return nil, nil
	}), wireserver.ServerConfig{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), wl) }()
	defer func() { srv.Close(); <-served }()
	conn, err := dial(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, wire.MaxFrameSize+1)); err != nil {
		t.Fatal(err)
	}
	fr, _ := wire.NewFrameReader(conn, 0)
	payload, err := readWithin(conn, fr, 20*time.Second)
	if err != nil {
		t.Fatalf("no notice before the close: %v", err)
	}
	notice, err := wire.DecodeResponse(payload)
	if err != nil || notice.ID != 0 || notice.Error.Code != errcode.CodeInvalid {
		t.Fatalf("notice %+v (%v), want id 0 invalid", notice, err)
	}
	select {
	case <-wl.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the receiver did not close the connection after the violation")
	}
	if ran.Load() != 0 {
		t.Fatal("handler ran")
	}
}

// closeListener closes closed when the server closes it.
type closeListener struct {
	wireserver.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *closeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// watchListener reports when a connection it accepted is closed.
type watchListener struct {
	wireserver.Listener
	closed chan struct{}
}

func (w *watchListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	c, err := w.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &watchConn{ReadWriteCloser: c, closed: w.closed}, nil
}

type watchConn struct {
	io.ReadWriteCloser
	closed chan struct{}
	once   sync.Once
}

func (c *watchConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.ReadWriteCloser.Close()
}

// readWithin reads one frame, failing after d (the connection is closed
// to unblock the read).
func readWithin(conn io.Closer, fr *wire.FrameReader, d time.Duration) ([]byte, error) {
	timer := time.AfterFunc(d, func() { conn.Close() })
	defer timer.Stop()
	return fr.ReadFrame()
}

// receiverLoss: the receiver goes away with calls in flight; they fail as
// fate unknown and later calls as unavailable.
func receiverLoss(t *testing.T, setup Setup) {
	var started sync.WaitGroup
	started.Add(3)
	e := start(t, setup, wireserver.HandlerFunc(func(c context.Context, req *wire.Request) (any, error) {
		started.Done()
		<-c.Done()
		return nil, c.Err()
	}))
	errs := make(chan error, 3)
	for i := range 3 {
		go func() { _, err := call(t, e.client, fmt.Sprintf("l-%d", i), "x"); errs <- err }()
	}
	started.Wait()
	e.srv.Close()
	for range 3 {
		if err := <-errs; codeOf(err) != errcode.CodeFateUnknown {
			t.Fatalf("call in flight when the receiver went away: %v, want fate_unknown", err)
		}
	}
	if _, err := call(t, e.client, "after", "x"); codeOf(err) != errcode.CodeUnavailable {
		t.Fatalf("call after the loss: %v, want unavailable", err)
	}
}
