package wire

import "context"

// Handler serves one decoded request on the receiver side. The server calls
// Serve on its own goroutine per request, so Serve may block (exec_wait);
// ctx ends at the request's deadline or when the connection closes. The
// result is marshalled into Response.Result. An error that is (or wraps) an
// *Error travels with its Code; any other error is sent as CodeInternal
// with a generic message, so internals never leak to the peer.
type Handler interface {
	Serve(ctx context.Context, req *Request) (result any, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *Request) (any, error)

// Serve calls f.
func (f HandlerFunc) Serve(ctx context.Context, req *Request) (any, error) { return f(ctx, req) }
