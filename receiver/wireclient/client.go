// Package wireclient is the custodian's side of the wire protocol: a
// Client that sends requests over one connection to a receiver and routes
// the answers back. The protocol itself (messages, frames, strict
// decoding, limits) is receiver/wire, a contract leaf that holds neither
// this client nor the server (receiver/wireserver).
package wireclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
)

// DefaultResponseGrace is how long a Client waits for an answer after the
// request's deadline before it gives the call up as fate unknown. The
// receiver answers a request that hits its deadline with CodeTimeout; the
// grace lets that answer arrive.
const DefaultResponseGrace = 2 * time.Second

// ClientConfig tunes a Client. The zero value is valid.
type ClientConfig struct {
	// MaxFrame bounds frames in both directions; 0 means MaxFrameSize,
	// larger values are refused.
	MaxFrame int
	// ResponseGrace overrides DefaultResponseGrace when positive.
	ResponseGrace time.Duration
}

// Client is the custodian's side of one connection. Calls are multiplexed
// by id and safe for concurrent use. The Client never re-sends a request:
// when the connection breaks, every call in flight fails with an error
// wrapping *Error{Code: CodeFateUnknown} (the request may or may not have
// run), and every later call fails with CodeUnavailable without being sent.
// To continue, dial a new connection and make a new Client.
type Client struct {
	conn  io.ReadWriteCloser
	limit int
	grace time.Duration

	wsem chan struct{} // one writer at a time; a channel so waiting obeys ctx

	mu      sync.Mutex
	pending map[uint64]chan *wire.Response
	lastID  uint64
	refuse  *errcode.Error // non-nil: new calls fail with it, unsent
	drain   bool           // the receiver announced shutdown: close once pending is empty
	cause   error          // why the connection ended (nil while it is up)

	done      chan struct{} // closed when the read loop has returned
	closeOnce sync.Once
}

// NewClient starts a client on conn, which it owns: Close (or a broken
// connection) closes conn. The caller must call Close, which joins the
// client's reader goroutine.
func NewClient(conn io.ReadWriteCloser, cfg ClientConfig) (*Client, error) {
	limit, err := wire.FrameLimit(cfg.MaxFrame)
	if err != nil {
		return nil, err
	}
	fr, err := wire.NewFrameReader(conn, limit)
	if err != nil {
		return nil, err
	}
	c := &Client{
		conn: conn, limit: limit, grace: DefaultResponseGrace,
		wsem:    make(chan struct{}, 1),
		pending: make(map[uint64]chan *wire.Response),
		done:    make(chan struct{}),
	}
	if cfg.ResponseGrace > 0 {
		c.grace = cfg.ResponseGrace
	}
	go c.readLoop(fr)
	return c, nil
}

// ErrNoAnswer is the cause recorded (see Err) when a request had no answer
// by its deadline plus the response grace: the client then ends the
// connection, failing every call in flight as fate unknown.
var ErrNoAnswer = errors.New("wire: receiver did not answer in time")

// ErrClientClosed is the cause recorded when Close ended the connection.
var ErrClientClosed = errors.New("wire: client closed")

// Close closes the connection and waits for the reader goroutine. Calls in
// flight fail as fate unknown; later calls fail with CodeUnavailable. Close
// is safe to call more than once; only the first returns conn's Close error.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.shut(ErrClientClosed, errcode.Errorf(errcode.CodeUnavailable, "client closed"))
		err = c.conn.Close()
		<-c.done
	})
	return err
}

// MaxFrame returns the frame limit of this client: a chunked transfer
// sizes its chunks by it.
func (c *Client) MaxFrame() int { return c.limit }

// Done is closed when the connection has ended (closed, broken, or a
// protocol violation); Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// Call sends one request and waits for its answer. args must be the op's
// args type (value or pointer, nil for the zero value); result, if not
// nil, is a pointer the result is strictly decoded into.
//
// The request's deadline is the earlier of deadline and ctx's deadline;
// one of them must be set. Errors:
//   - the receiver's refusal: its *Error, with the receiver's Code;
//   - not sent (nothing ran): *Error CodeInvalid (bad op or args type, no
//     deadline), CodeTimeout (deadline already passed), CodeTooLarge
//     (frame over the limit), CodeUnavailable (the
//     client is closed, the connection is gone or the receiver announced
//     shutdown); when ctx ends first, CodeTimeout wrapping ctx's error
//     for a passed deadline, ctx's error alone for a cancel;
//   - sent, answer lost: an error wrapping *Error CodeFateUnknown, and
//     ctx's error when ctx ended first. Never retry such a call blindly.
//     No answer by the deadline plus the response grace also ends the
//     connection (Err wraps ErrNoAnswer): the receiver answers every
//     request by its deadline, so silence means it or the link is gone.
func (c *Client) Call(ctx context.Context, op wire.Op, tupleSHA256, opKey string,
	deadline time.Time, args, result any) error {
	return c.CallFenced(ctx, op, tupleSHA256, opKey, 0, deadline, args, result)
}

// CallFenced is Call with a fencing token in the request (Request.Fence;
// 0 sends none). A receiver that has seen a higher token for the tuple
// refuses the request with CodeFenced without running it.
func (c *Client) CallFenced(ctx context.Context, op wire.Op, tupleSHA256, opKey string, fence uint64,
	deadline time.Time, args, result any) error {
	if err := ctx.Err(); err != nil {
		return notSent(fmt.Sprintf("call %s", op), err)
	}
	if dl, ok := ctx.Deadline(); ok && (deadline.IsZero() || dl.Before(deadline)) {
		deadline = dl
	}
	frame, id, ch, err := c.prepare(op, wire.Request{TupleSHA256: tupleSHA256, OpKey: opKey, Fence: fence}, deadline, args)
	if err != nil {
		return err
	}
	if err := c.send(ctx, id, frame, deadline); err != nil {
		return err
	}
	return c.await(ctx, op, id, ch, deadline.Add(c.grace), result, asksBinary(args))
}

// asksBinary reports whether args ask for a binary answer (a read_chunk
// with Binary set): only such a call accepts one.
func asksBinary(args any) bool {
	switch a := args.(type) {
	case *wire.ReadChunkArgs:
		return a != nil && a.Binary
	case wire.ReadChunkArgs:
		return a.Binary
	}
	return false
}

// BinaryFrames reports that this client speaks binary data frames
// (CallChunk, read_chunk answers asked for with Binary).
func (c *Client) BinaryFrames() bool { return true }

// CallChunk sends one write_chunk as a binary frame (docs/protocol.md
// "Binary data frames"): args without data, and data raw beside them. Use
// it only on a transfer whose write_begin carried Binary and was
// accepted. Errors are CallFenced's.
func (c *Client) CallChunk(ctx context.Context, tupleSHA256, opKey string, fence uint64,
	deadline time.Time, args *wire.WriteChunkArgs, data []byte, result *wire.WriteChunkResult) error {
	if err := ctx.Err(); err != nil {
		return notSent("call write_chunk", err)
	}
	if dl, ok := ctx.Deadline(); ok && (deadline.IsZero() || dl.Before(deadline)) {
		deadline = dl
	}
	if args == nil || args.Data != nil {
		return errcode.Errorf(errcode.CodeInvalid, "call write_chunk: binary args must carry no data of their own")
	}
	env := wire.Request{TupleSHA256: tupleSHA256, OpKey: opKey, Fence: fence}
	frame, id, ch, err := c.prepareFrame(wire.OpWriteChunk, env, deadline, args, data)
	if err != nil {
		return err
	}
	if err := c.send(ctx, id, frame, deadline); err != nil {
		return err
	}
	return c.await(ctx, wire.OpWriteChunk, id, ch, deadline.Add(c.grace), result, false)
}

// prepare validates the call, registers a new id, then encodes the
// request (outside the lock: a frame can be a megabyte). env carries the
// request's tuple digest, op key and fencing token.
func (c *Client) prepare(op wire.Op, env wire.Request, deadline time.Time, args any) ([]byte, uint64, chan *wire.Response, error) {
	return c.prepareFrame(op, env, deadline, args, nil)
}

// prepareFrame is prepare; a non-nil data makes the request a binary
// frame carrying it (write_chunk alone).
func (c *Client) prepareFrame(op wire.Op, env wire.Request, deadline time.Time, args any, data []byte) ([]byte, uint64, chan *wire.Response, error) {
	if deadline.IsZero() {
		return nil, 0, nil, errcode.Errorf(errcode.CodeInvalid, "call %s: no deadline (set one or give ctx one)", op)
	}
	if !time.Now().Before(deadline) {
		return nil, 0, nil, errcode.Errorf(errcode.CodeTimeout, "call %s: deadline %s already passed; not sent",
			op, deadline.UTC().Format(time.RFC3339Nano))
	}
	raw, err := encodeArgs(op, args)
	if err != nil {
		return nil, 0, nil, err
	}
	c.mu.Lock()
	if c.refuse != nil {
		defer c.mu.Unlock()
		return nil, 0, nil, c.refuse
	}
	c.lastID++
	id, ch := c.lastID, make(chan *wire.Response, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	req := wire.Request{ID: id, Op: op, TupleSHA256: env.TupleSHA256, OpKey: env.OpKey, Fence: env.Fence, Deadline: deadline.UTC(), Args: raw}
	var payload []byte
	if data != nil {
		payload, err = wire.EncodeBinaryRequest(&req, data)
	} else {
		payload, err = wire.EncodeRequest(&req)
	}
	if err != nil {
		c.forget(id)
		return nil, 0, nil, errcode.Errorf(errcode.CodeInvalid, "call %s: encode request: %v", op, err)
	}
	frame, err := wire.AppendFrame(make([]byte, 0, wire.HeaderSize+len(payload)), payload, c.limit)
	if err != nil {
		c.forget(id)
		return nil, 0, nil, errcode.Errorf(errcode.CodeTooLarge, "call %s: request of %d bytes exceeds the frame limit %d",
			op, len(payload), c.limit)
	}
	return frame, id, ch, nil
}

// encodeArgs checks that args is op's args type and marshals it.
func encodeArgs(op wire.Op, args any) (json.RawMessage, error) {
	t := wire.ArgsType(op)
	if t == nil {
		return nil, errcode.Errorf(errcode.CodeInvalid, "call: unknown op %q", op)
	}
	if args == nil {
		args = reflect.New(t).Interface()
	}
	at := reflect.TypeOf(args)
	if at != t && at != reflect.PointerTo(t) {
		return nil, errcode.Errorf(errcode.CodeInvalid, "call %s: args are %v, want %v", op, at, t)
	}
	if reflect.ValueOf(args).Kind() == reflect.Pointer && reflect.ValueOf(args).IsNil() {
		args = reflect.New(t).Interface()
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, errcode.Errorf(errcode.CodeInvalid, "call %s: encode args: %v", op, err)
	}
	return raw, nil
}

// send writes one frame. Waiting for the writer slot obeys ctx (nothing
// sent). A failed or partial write leaves the stream out of sync, so it
// ends the connection and the call's fate is unknown.
func (c *Client) send(ctx context.Context, id uint64, frame []byte, deadline time.Time) error {
	select {
	case c.wsem <- struct{}{}:
	case <-ctx.Done():
		c.forget(id)
		return notSent(fmt.Sprintf("request %d", id), ctx.Err())
	case <-c.done:
		c.forget(id)
		return c.refusal()
	}
	if !c.stillPending(id) { // the connection ended before this write
		<-c.wsem
		return c.refusal()
	}
	if err := ctx.Err(); err != nil { // ctx ended while waiting for the slot
		<-c.wsem
		c.forget(id)
		return notSent(fmt.Sprintf("request %d", id), err)
	}
	d, canDeadline := c.conn.(interface{ SetWriteDeadline(time.Time) error })
	if canDeadline {
		_ = d.SetWriteDeadline(deadline)
	}
	_, err := c.conn.Write(frame)
	if canDeadline {
		_ = d.SetWriteDeadline(time.Time{})
	}
	<-c.wsem
	if err != nil {
		c.fail(fmt.Errorf("write request %d: %w", id, err))
		return fateUnknown(id, err)
	}
	return nil
}

// await waits for the answer to id until ctx ends or giveUp passes.
func (c *Client) await(ctx context.Context, op wire.Op, id uint64, ch chan *wire.Response,
	giveUp time.Time, result any, binaryOK bool) error {
	timer := time.NewTimer(time.Until(giveUp))
	defer timer.Stop()
	var resp *wire.Response
	select {
	case resp = <-ch:
	case <-ctx.Done():
		if resp = c.abandon(id, ch); resp == nil {
			return fateUnknown(id, ctx.Err())
		}
	case <-timer.C:
		if resp = c.abandon(id, ch); resp == nil {
			// A live receiver answers every request by its deadline; a
			// missing answer means the receiver or the link is gone, which
			// a byte stream would never show otherwise. End the connection
			// so the caller redials instead of waiting on a dead one.
			cause := fmt.Errorf("%w: request %d unanswered %s after its deadline", ErrNoAnswer, id, c.grace)
			c.fail(cause)
			return fateUnknown(id, cause)
		}
	}
	if resp.ID == 0 { // the connection ended with the call in flight
		return fateUnknown(id, c.Err())
	}
	if resp.Error != nil {
		return resp.Error
	}
	if resp.Binary {
		return c.binaryResult(op, id, resp, result, binaryOK)
	}
	var err error
	if result != nil {
		if err = wire.DecodeResult(resp.Result, result); err == nil {
			return nil
		}
	}
	// The frame decoder left the result's syntax to this decode; a frame
	// that is not JSON ends the connection, as it would have there.
	if !json.Valid(resp.Result) {
		c.fail(fmt.Errorf("%w: %s result of request %d is not valid JSON", wire.ErrMalformed, op, id))
		return fateUnknown(id, c.Err())
	}
	if err != nil {
		return fmt.Errorf("wire: %s result of request %d: %w", op, id, err)
	}
	return nil
}

// binaryResult decodes a binary answer into result, a *ReadChunkResult
// (or nil). A binary answer the call did not ask for ends the connection
// as a protocol violation.
func (c *Client) binaryResult(op wire.Op, id uint64, resp *wire.Response, result any, binaryOK bool) error {
	res, ok := result.(*wire.ReadChunkResult)
	if !binaryOK || (!ok && result != nil) {
		c.fail(fmt.Errorf("%w: binary answer to %s request %d, which did not ask for one", wire.ErrProtocol, op, id))
		return fateUnknown(id, c.Err())
	}
	if res == nil {
		res = new(wire.ReadChunkResult)
	}
	if err := wire.BinaryReadChunkResult(resp, res); err != nil {
		c.fail(fmt.Errorf("%s binary result of request %d: %w", op, id, err))
		return fateUnknown(id, c.Err())
	}
	return nil
}

// abandon removes id from the pending set; if its answer raced in, that
// answer is returned instead.
func (c *Client) abandon(id uint64, ch chan *wire.Response) *wire.Response {
	c.mu.Lock()
	delete(c.pending, id)
	drained := c.drained()
	c.mu.Unlock()
	if drained != nil {
		c.fail(drained)
	}
	select {
	case r := <-ch:
		return r
	default:
		return nil
	}
}

func (c *Client) stillPending(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	return ok
}

// forget removes an unsent call; on a draining connection the last one
// leaving closes it.
func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	drained := c.drained()
	c.mu.Unlock()
	if drained != nil {
		c.fail(drained)
	}
}

func (c *Client) refusal() *errcode.Error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refuse != nil {
		return c.refuse
	}
	return errcode.Errorf(errcode.CodeUnavailable, "connection closed")
}

// fateUnknown wraps cause in a CodeFateUnknown *Error.
// notSent is the error of a call that ctx ended before it was written:
// nothing ran. A passed deadline is CodeTimeout, so callers and agents see
// a code; a cancel keeps only ctx's error (the caller cancelled it).
func notSent(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", errcode.Errorf(errcode.CodeTimeout, "%s not sent: its deadline passed first", what), err)
	}
	return fmt.Errorf("wire: %s not sent: %w", what, err)
}

func fateUnknown(id uint64, cause error) error {
	return fmt.Errorf("%w: %w", errcode.Errorf(errcode.CodeFateUnknown,
		"request %d was sent but its answer was lost; it may or may not have run", id), cause)
}

// readLoop routes answers to their calls until the connection ends.
func (c *Client) readLoop(fr *wire.FrameReader) {
	defer close(c.done)
	for {
		payload, err := fr.ReadFrame()
		if err != nil {
			c.fail(err)
			return
		}
		resp, err := wire.DecodeResponseFrame(payload)
		if err == nil {
			err = c.route(resp)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// route hands resp to its call. A notice (id 0) of shutdown stops new
// calls, and the connection is closed once the last call in flight has its
// answer; any other notice means the receiver is closing the connection
// (on a byte stream nothing else would tell us), so it ends it here too.
// An answer to an id never sent is a protocol violation; an answer to an
// abandoned call is dropped.
func (c *Client) route(resp *wire.Response) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp.ID == 0 {
		if resp.Error.Code != errcode.CodeUnavailable { // the receiver is closing this connection
			return fmt.Errorf("receiver closed the connection: %w", resp.Error)
		}
		if c.refuse == nil {
			c.refuse = errcode.Errorf(errcode.CodeUnavailable, "receiver notice: %s", resp.Error.Message)
		}
		c.drain = true
		return c.drained()
	}
	if resp.ID > c.lastID {
		return fmt.Errorf("%w: answer to request %d, never sent", wire.ErrProtocol, resp.ID)
	}
	if ch, ok := c.pending[resp.ID]; ok {
		delete(c.pending, resp.ID)
		ch <- resp
	}
	return c.drained()
}

// ErrReceiverShutdown is the cause recorded (see Err) when the receiver
// announced its shutdown and the client closed the connection after the
// last call in flight was answered.
var ErrReceiverShutdown = errors.New("wire: receiver shut down the connection")

// drained reports ErrReceiverShutdown once a draining connection has no
// call in flight: the client closes it itself, because on a byte stream
// the receiver closing its end is invisible. c.mu is held.
func (c *Client) drained() error {
	if c.drain && len(c.pending) == 0 {
		return ErrReceiverShutdown
	}
	return nil
}

// fail ends the connection because of cause: it closes conn and fails every
// call in flight as fate unknown.
func (c *Client) fail(cause error) {
	if errors.Is(cause, io.EOF) {
		cause = fmt.Errorf("connection closed by the receiver: %w", cause)
	}
	c.shut(cause, errcode.Errorf(errcode.CodeUnavailable, "connection lost: %v", cause))
	_ = c.conn.Close()
}

// shut records the first cause and refusal, and wakes every pending call
// with the lost-connection sentinel (a Response with id 0).
func (c *Client) shut(cause error, refuse *errcode.Error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause == nil {
		c.cause = cause
	}
	if c.refuse == nil || errors.Is(cause, ErrClientClosed) {
		c.refuse = refuse
	}
	for id, ch := range c.pending {
		delete(c.pending, id)
		ch <- &wire.Response{ID: 0}
	}
}
