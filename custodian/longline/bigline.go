// Package longline reads the agent's output for the custodian: lines the
// ACP SDK can read go on to it, longer ones are served or refused here,
// under caps on how many such lines and how many of their bytes the
// custodian holds at once. It calls back into the custodian only through
// Server.
package longline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
)

// acp-go-sdk v0.13.0 reads each JSON-RPC message as one line of at most
// 10 MiB (a bufio.Scanner bound); a longer line ends the connection. A
// write_text_file of a file up to max_file_bytes (64 MiB by default) is
// longer than that. So the custodian reads the agent's output itself: a
// line up to SDKLineMax goes on to the SDK unchanged; a longer one that is
// an fs/write_text_file request is served here, through the same client
// methods (Server), and its answer written to the agent as one whole line
// beside the SDK's (LockedWriter); any other long message is refused.

const (
	// SDKLineMax is the longest line handed to the SDK (its bound, 10 MiB,
	// less room for the newline).
	SDKLineMax = 10<<20 - 1024
	// maxAgentLine bounds one message from the agent: a 64 MiB file with
	// JSON escaping to spare.
	maxAgentLine = 384 << 20
)

// errLineTooLong ends the agent's connection: a message past maxAgentLine.
var errLineTooLong = errors.New("agent message longer than the custodian reads")

// Server is the custodian's side of one connection, as the long-line
// path uses it.
type Server interface {
	// WriteTextFile serves a long fs/write_text_file request, as the
	// SDK would serve a short one.
	WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error)
	// WriteTextFileContent serves a long fs/write_text_file request whose
	// content (p.Content is empty) is c, decoded as it is read; c is valid
	// until it returns.
	WriteTextFileContent(ctx context.Context, p acp.WriteTextFileRequest, c *Content) (acp.WriteTextFileResponse, error)
	// ReadTextFile serves an fs/read_text_file request, as the SDK would
	// (reads.go: its answer is streamed here, not by the SDK). A long
	// content comes in fc (resp.Content is then empty), which the caller
	// closes, even with an error.
	ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (resp acp.ReadTextFileResponse, fc *FileContent, err error)
	// Refused counts a refused long message in the connection's
	// refusals; method is its method when that is a string ("" else).
	Refused(code errcode.Code, method string)
	// Decoded is told that a long request of method was decoded, before
	// it is served.
	Decoded(method string)
}

// LockedWriter makes each Write whole: the SDK writes one message per
// Write, and so does the long-line path. Both write the agent's input
// through one LockedWriter.
type LockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewLockedWriter returns a LockedWriter over w; closing w stays with
// the caller.
func NewLockedWriter(w io.Writer) *LockedWriter { return &LockedWriter{w: w} }

// Write writes p to the underlying writer, one Write at a time.
func (l *LockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Stream writes one message through fn, whole: no other Write or Stream
// runs until fn returns. fn writes to a buffer of 64 KiB over the
// underlying writer, flushed after it, so a long message is never held
// whole; its error, or the flush's, is returned.
func (l *LockedWriter) Stream(fn func(w *bufio.Writer) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := bufio.NewWriterSize(l.w, 64<<10)
	if err := fn(w); err != nil {
		return err
	}
	return w.Flush()
}

// Reader reads the agent's output for the SDK: it returns short lines
// as they are and serves long ones itself. At the end of the agent's
// output it waits for the long requests in flight, then reports the end.
type Reader struct {
	br      *bufio.Reader
	pending [][]byte // the rest of the line being read by the SDK, in pieces
	err     error
	out     *LockedWriter
	srv     Server // nil in tests of the reader alone
	log     *slog.Logger
	caps    *Caps // nil: no caps, a long line is held in memory as it is read
	calls   sync.WaitGroup
}

var (
	_ io.Reader = (*Reader)(nil)
	_ io.Writer = (*LockedWriter)(nil)
)

// NewReader wraps the agent's output from; the SDK reads the result.
// Answers to long requests are written to out, served through srv. caps
// bounds the long lines (nil: none). Closing from stays with the caller.
func NewReader(from io.Reader, out *LockedWriter, srv Server, log *slog.Logger, caps *Caps) *Reader {
	return &Reader{br: bufio.NewReaderSize(from, 1<<20), out: out, srv: srv, log: log, caps: caps}
}

// Read gives the SDK the next short lines.
func (ll *Reader) Read(p []byte) (int, error) {
	for len(ll.pending) == 0 {
		if ll.err != nil {
			ll.calls.Wait()
			return 0, ll.err
		}
		line, long, err := readShort(ll.br)
		switch {
		case long:
			err = ll.takeLong(line)
			line = nil
		case ll.takeRead(line):
			line = nil
		}
		ll.err = err
		ll.pending = line
	}
	n := copy(p, ll.pending[0])
	if ll.pending[0] = ll.pending[0][n:]; len(ll.pending[0]) == 0 {
		ll.pending = ll.pending[1:]
	}
	return n, nil
}

// readShort returns one line with its newline, or, with long set, the
// first bytes of a line longer than SDKLineMax (the rest unread), in the
// non-empty pieces it was read in: a line is never copied to grow it, so
// a long one costs no garbage before it is known to be long.
func readShort(br *bufio.Reader) (line [][]byte, long bool, err error) {
	n := 0
	for {
		part, err := br.ReadSlice('\n')
		if len(part) > 0 {
			line = append(line, bytes.Clone(part))
			n += len(part)
		}
		if n > SDKLineMax {
			return line, true, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, false, err
		}
	}
}

// takeLong reads the rest of a long line whose first pieces are head and
// serves it: held in memory without caps, else spooled under ll.caps.
// It returns the error that ends the agent's output, if any.
func (ll *Reader) takeLong(head [][]byte) error {
	if ll.caps == nil {
		line, err := readRest(ll.br, bytes.Join(head, nil))
		if line != nil {
			ll.serveLong(line)
		}
		return err
	}
	return ll.spoolLong(head)
}

// readRest reads on to the end of the line begun by head, at most
// maxAgentLine bytes, holding all of it (the path without caps).
func readRest(br *bufio.Reader, head []byte) ([]byte, error) {
	line := head
	for !bytes.HasSuffix(line, []byte("\n")) {
		part, err := br.ReadSlice('\n')
		line = append(line, part...)
		if len(line) > maxAgentLine {
			return nil, errLineTooLong
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
	return line, nil
}

// longRequest is a long agent message decoded in one pass, its params as
// the one request served (a second pass over a params RawMessage would
// scan and copy the whole content again).
type longRequest struct {
	ID     json.RawMessage          `json:"id"`
	Method string                   `json:"method"`
	Params acp.WriteTextFileRequest `json:"params"`
	// content, if set, is the write's content left in the line
	// (decodeRawLong); Params.Content is then empty.
	content *Content
}

// serveLong answers a long request on its own goroutine (the path
// without caps).
func (ll *Reader) serveLong(line []byte) {
	msg, derr, ok := ll.decodeLong(line, nil)
	if !ok {
		return
	}
	n := len(line) // the closure keeps line alive only through msg.content
	ll.calls.Go(func() { ll.runLong(msg, derr, n) })
}

// decodeLong decodes a long message; ok is false (and the message logged
// and dropped) when it is no request. derr is a params type error.
//
// A write's content is left in line (decodeRawLong); done, if set, is
// told what of it each pass has read for good (the Content's done).
func (ll *Reader) decodeLong(line []byte, done func(rest []byte)) (msg *longRequest, derr error, ok bool) {
	if msg, ok := decodeRawLong(line, done); ok {
		return msg, nil, true
	}
	msg = new(longRequest)
	err := json.Unmarshal(line, msg)
	var te *json.UnmarshalTypeError
	if (err != nil && !errors.As(err, &te)) || len(msg.ID) == 0 {
		ll.log.Warn("custodian: dropped a long agent message that is not a request", "bytes", len(line))
		return nil, nil, false
	}
	return msg, err, true
}

// runLong serves a decoded long request of n bytes and answers it. The
// line it was decoded from is kept alive meanwhile only when the
// request's content is still in it (msg.content).
func (ll *Reader) runLong(msg *longRequest, derr error, n int) {
	if ll.srv != nil {
		ll.srv.Decoded(msg.Method)
	}
	res, err := ll.serve(msg, derr, n)
	ll.answer(msg.ID, res, err)
}

// serve runs a long request: fs/write_text_file only. decodeErr is a
// params type error (any other method's params may not fit the write's).
func (ll *Reader) serve(msg *longRequest, decodeErr error, n int) (any, error) {
	if msg.Method != acp.ClientMethodFsWriteTextFile {
		return nil, &acp.RequestError{Code: -32600, Message: "message of " + strconv.Itoa(n) + " bytes: only fs/write_text_file may be longer than 10 MiB"}
	}
	if decodeErr != nil {
		return nil, acp.NewInvalidParams(map[string]any{"error": decodeErr.Error()})
	}
	if msg.content != nil {
		return ll.srv.WriteTextFileContent(context.Background(), msg.Params, msg.content)
	}
	return ll.srv.WriteTextFile(context.Background(), msg.Params)
}

// answer writes the JSON-RPC response of a long request as one line.
func (ll *Reader) answer(id json.RawMessage, result any, err error) {
	resp := map[string]any{"jsonrpc": "2.0", "id": id}
	var re *acp.RequestError
	switch {
	case errors.As(err, &re):
		resp["error"] = re
	case err != nil:
		resp["error"] = acp.NewInternalError(map[string]any{"error": err.Error()})
	default:
		resp["result"] = result
	}
	b, merr := json.Marshal(resp)
	if merr != nil {
		ll.log.Error("custodian: encode the answer to a long request", "err", merr)
		return
	}
	if _, werr := ll.out.Write(append(b, '\n')); werr != nil {
		ll.log.Warn("custodian: answer to a long request not written", "err", werr)
	}
}
