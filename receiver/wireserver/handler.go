package wireserver

import (
	"context"

	"github.com/tetherdev/tether/receiver/wire"
)

// Handler serves one decoded request on the receiver side. The server calls
// Serve on its own goroutine per request, so Serve may block (exec_wait);
// ctx ends at the request's deadline or when the connection closes. The
// result is marshalled into Response.Result. An error that is (or wraps) an
// *Error travels with its Code; any other error is sent as CodeInternal
// with a generic message, so internals never leak to the peer.
type Handler interface {
	Serve(ctx context.Context, req *wire.Request) (result any, err error)
}

// AfterWriter is implemented by a result that still needs its request's
// goroutine once the answer is out. When a handler returns such a result,
// the Server writes the answer, stops counting the request as in flight
// (Shutdown and Close do not wait for what follows), then calls AfterWrite
// on the same goroutine, which ends when AfterWrite returns. It is called
// whether or not the answer could be written.
type AfterWriter interface {
	AfterWrite()
}

// ownedKey marks the context of a handler running on a goroutine the
// Server started for that one request.
type ownedKey struct{}

// OwnsGoroutine reports whether a handler called with ctx runs on a
// goroutine the Server started for this request alone: it ends after the
// answer is written and the result's AfterWrite (if any) has returned, and
// runs nothing else. Such a handler may lock the goroutine to its OS thread
// and leave it locked; the runtime destroys the thread when the goroutine
// ends. Direct callers of Handler.Serve make no such promise.
func OwnsGoroutine(ctx context.Context) bool {
	owned, _ := ctx.Value(ownedKey{}).(bool)
	return owned
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *wire.Request) (any, error)

// Serve calls f.
func (f HandlerFunc) Serve(ctx context.Context, req *wire.Request) (any, error) { return f(ctx, req) }

// Conn describes the connection a request arrived on, for a handler that
// keeps state per connection (the receiver hands a command's terminal to
// the connection that started it, docs/protocol.md "Processes").
type Conn struct {
	// ID is unique among the connections of this process.
	ID uint64
	// Peer is PeerOf the connection.
	Peer string
	done <-chan struct{}
}

// Done is closed once the connection has ended (the peer closed it, a
// violation or the server's shutdown ended it). Requests still running
// then are cancelled as well.
func (c *Conn) Done() <-chan struct{} { return c.done }

// connKey holds the *Conn of a request's connection in its context.
type connKey struct{}

// ConnOf returns the connection a handler's request arrived on, or nil
// for a request served outside a Server (a direct Handler.Serve call).
func ConnOf(ctx context.Context) *Conn {
	c, _ := ctx.Value(connKey{}).(*Conn)
	return c
}
