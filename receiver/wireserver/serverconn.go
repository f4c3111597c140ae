package wireserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/wire"
)

// serverConn is one connection served by a Server.
type serverConn struct {
	s    *Server
	conn io.ReadWriteCloser
	peer string // PeerOf(conn), for the per-peer cap

	ctx    context.Context // ends when the connection ends; parent of handler contexts
	cancel context.CancelCauseFunc

	wmu sync.Mutex // one answer written at a time

	mu       sync.Mutex
	inflight map[uint64]struct{}
	wg       sync.WaitGroup // this connection's running handlers
}

// connIDs numbers the connections of this process (Conn.ID).
var connIDs atomic.Uint64

func newServerConn(s *Server, ctx context.Context, conn io.ReadWriteCloser, peer string) *serverConn {
	sc := &serverConn{s: s, conn: conn, peer: peer, inflight: make(map[uint64]struct{})}
	ctx, sc.cancel = context.WithCancelCause(ctx)
	sc.ctx = context.WithValue(ctx, connKey{}, &Conn{ID: connIDs.Add(1), Peer: peer, done: ctx.Done()})
	return sc
}

// serve runs the read loop, then cancels and joins the handlers and closes
// the connection.
func (sc *serverConn) serve() error {
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() { // closing conn is what unblocks a pending read
		select {
		case <-sc.ctx.Done():
		case <-sc.s.base.Done():
			sc.cancel(context.Cause(sc.s.base))
		case <-done:
			return
		}
		_ = sc.conn.Close()
	})
	fr, err := wire.NewFrameReader(sc.conn, sc.s.limit)
	if err == nil {
		err = sc.readLoop(fr)
	}
	sc.cancel(connEnded(err))
	close(done)
	watch.Wait()
	sc.wg.Wait()
	_ = sc.conn.Close()
	return err
}

func connEnded(err error) error {
	if err == nil {
		return errors.New("wire: connection closed by the peer")
	}
	return err
}

// readLoop reads and dispatches requests until the connection ends. It
// returns nil on a clean end of stream at a frame boundary.
func (sc *serverConn) readLoop(fr *wire.FrameReader) error {
	for {
		payload, err := fr.ReadFrame()
		switch {
		case err == nil:
		case sc.ctx.Err() != nil:
			return context.Cause(sc.ctx)
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, wire.ErrFrameTooLarge), errors.Is(err, wire.ErrFrameEmpty):
			sc.notice(errcode.CodeInvalid, err.Error())
			return violation(err)
		default:
			return err
		}
		req, err := wire.DecodeRequestFrame(payload)
		var refusal *errcode.Error
		if errors.As(err, &refusal) {
			err = nil
		}
		if err == nil {
			err = sc.dispatch(req, refusal)
		}
		if err != nil {
			sc.s.log.Warn("wire: protocol violation; closing connection", "err", err)
			sc.notice(errcode.CodeInvalid, err.Error())
			return violation(err)
		}
	}
}

// dispatch starts req on its own goroutine, or answers it at once when it
// is refused (invalid, shutting down, over the in-flight bound, already
// past its deadline). An id already in flight is a protocol violation.
func (sc *serverConn) dispatch(req *wire.Request, refusal *errcode.Error) error {
	sc.mu.Lock()
	if _, dup := sc.inflight[req.ID]; dup {
		sc.mu.Unlock()
		return fmt.Errorf("%w: request id %d is already in flight", wire.ErrProtocol, req.ID)
	}
	if refusal == nil {
		refusal = sc.admit(req)
	}
	if refusal == nil {
		sc.inflight[req.ID] = struct{}{}
		sc.wg.Add(1)
	}
	sc.mu.Unlock()
	if refusal != nil {
		sc.write(req.ID, encodeAnswer(sc.s, req.ID, nil, refusal))
		return nil
	}
	go sc.run(req)
	return nil
}

// admit decides whether req may run; sc.mu is held.
func (sc *serverConn) admit(req *wire.Request) *errcode.Error {
	if now := time.Now(); !now.Before(req.Deadline) {
		return wire.ExpiredError(req.Deadline, now)
	}
	if len(sc.inflight) >= sc.s.maxInFlight {
		return errcode.Errorf(errcode.CodeUnavailable, "in-flight limit of %d requests on this connection reached; not run",
			sc.s.maxInFlight)
	}
	if !sc.s.admitHandler() {
		return errcode.Errorf(errcode.CodeUnavailable, "receiver shutting down; not run")
	}
	return nil
}

// run serves one admitted request and writes its answer. It runs on a
// goroutine of its own (OwnsGoroutine), which ends after the answer and
// the result's AfterWrite.
func (sc *serverConn) run(req *wire.Request) {
	ctx, cancel := context.WithDeadline(context.WithValue(sc.ctx, ownedKey{}, true), req.Deadline)
	result, err := sc.s.h.Serve(ctx, req)
	if after, ok := result.(AfterWriter); ok {
		defer after.AfterWrite() // after the in-flight accounting below is released
	}
	defer sc.s.handlers.Done()
	defer sc.wg.Done()
	if err != nil && ctx.Err() != nil && !isWireError(err) {
		err = ctxRefusal(ctx)
	}
	cancel()
	sc.mu.Lock()
	delete(sc.inflight, req.ID)
	sc.mu.Unlock()
	if rc, ok := result.(*wire.ReadChunkResult); ok && err == nil && req.WantsBinary() {
		sc.write(req.ID, encodeBinaryAnswer(sc.s, req.ID, rc))
		return
	}
	sc.write(req.ID, encodeAnswer(sc.s, req.ID, result, err))
}

// encodeBinaryAnswer builds the binary answer frame payload to a
// read_chunk that asked for one; one over the frame limit becomes a JSON
// CodeTooLarge, as encodeAnswer's would.
func encodeBinaryAnswer(s *Server, id uint64, res *wire.ReadChunkResult) []byte {
	payload, err := wire.EncodeBinaryReadChunk(id, res)
	if err != nil {
		return encodeAnswer(s, id, nil, err)
	}
	if len(payload) > s.limit {
		return encodeAnswer(s, id, nil, wire.BinaryAnswerTooLarge(len(payload), s.limit))
	}
	return payload
}

func isWireError(err error) bool {
	var e *errcode.Error
	return errors.As(err, &e)
}

// ctxRefusal names why a handler's context ended.
func ctxRefusal(ctx context.Context) *errcode.Error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errcode.Errorf(errcode.CodeTimeout, "request deadline reached")
	}
	return errcode.Errorf(errcode.CodeInterrupted, "request cancelled (%v); it may have partly run", context.Cause(ctx))
}

// encodeAnswer builds the answer frame payload for id. An answer that
// would not fit in a frame becomes CodeTooLarge.
func encodeAnswer(s *Server, id uint64, result any, err error) []byte {
	resp := wire.Response{ID: id}
	if err != nil {
		resp.Error = publicError(s, id, err)
	} else {
		if result == nil {
			result = wire.Empty{}
		}
		raw, merr := json.Marshal(result)
		if merr != nil {
			s.log.Error("wire: cannot encode result", "id", id, "err", merr)
			resp.Error = errcode.Errorf(errcode.CodeInternal, "internal error")
		} else {
			resp.Result = raw
		}
	}
	var payload []byte
	if resp.Error == nil {
		// json.Marshal's output is compact, valid JSON: the envelope is
		// written around it, not encoded (and the result scanned) again.
		payload = append(strconv.AppendUint(append(make([]byte, 0, len(resp.Result)+40), `{"id":`...), id, 10), `,"result":`...)
		payload = append(append(payload, resp.Result...), '}')
	} else {
		payload, _ = json.Marshal(&resp)
	}
	if len(payload) > s.limit {
		payload, _ = json.Marshal(&wire.Response{ID: id, Error: errcode.Errorf(errcode.CodeTooLarge,
			"answer of %d bytes exceeds the frame limit of %d", len(payload), s.limit)})
	}
	return payload
}

// publicError turns a handler error into what the peer may see: an *Error
// with a code from the closed set keeps its code and message; anything
// else becomes a generic CodeInternal and is logged here.
func publicError(s *Server, id uint64, err error) *errcode.Error {
	var e *errcode.Error
	if errors.As(err, &e) && e.Code.Valid() {
		return e
	}
	s.log.Error("wire: handler failed", "id", id, "err", err)
	return errcode.Errorf(errcode.CodeInternal, "internal error")
}

// notice writes a connection notice (id 0).
func (sc *serverConn) notice(code errcode.Code, msg string) {
	payload, _ := json.Marshal(&wire.Response{ID: 0, Error: &errcode.Error{Code: code, Message: msg}})
	sc.write(0, payload)
}

// write sends one answer. A failed write ends the connection: the stream
// may hold a partial frame.
func (sc *serverConn) write(id uint64, payload []byte) {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.ctx.Err() != nil {
		return
	}
	d, canDeadline := sc.conn.(interface{ SetWriteDeadline(time.Time) error })
	if canDeadline {
		_ = d.SetWriteDeadline(time.Now().Add(sc.s.writeTimeout))
	}
	if err := wire.WriteFrame(sc.conn, payload, sc.s.limit); err != nil {
		sc.cancel(fmt.Errorf("write answer %d: %w", id, err))
		return
	}
	if canDeadline {
		_ = d.SetWriteDeadline(time.Time{})
	}
}
