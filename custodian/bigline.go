package custodian

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
)

// acp-go-sdk v0.13.0 reads each JSON-RPC message as one line of at most
// 10 MiB (a bufio.Scanner bound); a longer line ends the connection. A
// write_text_file of a file up to max_file_bytes (64 MiB by default) is
// longer than that. So the custodian reads the agent's output itself: a
// line up to sdkLineMax goes on to the SDK unchanged; a longer one that is
// an fs/write_text_file request is served here, through the same client
// methods, and its answer written to the agent as one whole line beside
// the SDK's (lockedWriter); any other long message is refused.

const (
	// sdkLineMax is the longest line handed to the SDK (its bound, 10 MiB,
	// less room for the newline).
	sdkLineMax = 10<<20 - 1024
	// maxAgentLine bounds one message from the agent: a 64 MiB file with
	// JSON escaping to spare.
	maxAgentLine = 384 << 20
)

// errLineTooLong ends the agent's connection: a message past maxAgentLine.
var errLineTooLong = errors.New("agent message longer than the custodian reads")

// lockedWriter makes each Write whole: the SDK writes one message per
// Write, and so does the long-line path.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// longLines reads the agent's output for the SDK: it returns short lines
// as they are and serves long ones itself. At the end of the agent's
// output it waits for the long requests in flight, then reports the end.
type longLines struct {
	br      *bufio.Reader
	pending [][]byte // the rest of the line being read by the SDK, in pieces
	err     error
	out     *lockedWriter
	cl      *client
	log     *slog.Logger
	caps    *lineCaps // nil: no caps, a long line is held in memory as it is read
	calls   sync.WaitGroup
}

// splitLongLines wraps the agent's output; the SDK reads the result.
// caps bounds the long lines (nil: none).
func splitLongLines(from io.Reader, out *lockedWriter, cl *client, log *slog.Logger, caps *lineCaps) *longLines {
	return &longLines{br: bufio.NewReaderSize(from, 1<<20), out: out, cl: cl, log: log, caps: caps}
}

// Read gives the SDK the next short lines.
func (ll *longLines) Read(p []byte) (int, error) {
	for len(ll.pending) == 0 {
		if ll.err != nil {
			ll.calls.Wait()
			return 0, ll.err
		}
		line, long, err := readShort(ll.br)
		if long {
			err = ll.takeLong(line)
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
// first bytes of a line longer than sdkLineMax (the rest unread), in the
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
		if n > sdkLineMax {
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
func (ll *longLines) takeLong(head [][]byte) error {
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
}

// serveLong answers a long request on its own goroutine (the path
// without caps).
func (ll *longLines) serveLong(line []byte) {
	msg, derr, ok := ll.decodeLong(line)
	if !ok {
		return
	}
	n := len(line) // the closure must not keep line alive
	ll.calls.Go(func() { ll.runLong(msg, derr, n) })
}

// decodeLong decodes a long message; ok is false (and the message logged
// and dropped) when it is no request. derr is a params type error.
func (ll *longLines) decodeLong(line []byte) (msg *longRequest, derr error, ok bool) {
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
// line it was decoded from is not kept alive meanwhile.
func (ll *longLines) runLong(msg *longRequest, derr error, n int) {
	if ll.cl != nil && ll.cl.c.hook != nil {
		ll.cl.c.hook(context.Background(), msg.Method, "long-line-decoded")
	}
	res, err := ll.serve(msg, derr, n)
	ll.answer(msg.ID, res, err)
}

// serve runs a long request: fs/write_text_file only. decodeErr is a
// params type error (any other method's params may not fit the write's).
func (ll *longLines) serve(msg *longRequest, decodeErr error, n int) (any, error) {
	if msg.Method != acp.ClientMethodFsWriteTextFile {
		return nil, &acp.RequestError{Code: -32600, Message: "message of " + strconv.Itoa(n) + " bytes: only fs/write_text_file may be longer than 10 MiB"}
	}
	if decodeErr != nil {
		return nil, acp.NewInvalidParams(map[string]any{"error": decodeErr.Error()})
	}
	return ll.cl.WriteTextFile(context.Background(), msg.Params)
}

// answer writes the JSON-RPC response of a long request as one line.
func (ll *longLines) answer(id json.RawMessage, result any, err error) {
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
