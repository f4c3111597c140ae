package longline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"

	acp "github.com/coder/acp-go-sdk"
)

// The custodian serves fs/read_text_file here, beside the SDK, so that
// its answer is written once and streamed (writeReadResult) rather than
// encoded twice and held whole by the SDK. Everything else about the
// request is what acp-go-sdk v0.13.0 does (connection.go receive and
// handleInbound, client_gen.go's fs/read_text_file case): the line is
// decoded into the SDK's envelope, its params into the request type and
// validated, the same client method serves it, an error becomes the same
// JSON-RPC error, and the answer is the envelope json.Marshal writes, byte
// for byte. A line that is not plainly such a request (no id, another
// method, not one piece, not decodable) goes on to the SDK unchanged.
//
// One difference: the agent's $/cancel_request does not reach a read
// served here (the SDK knows only the requests it runs). A read is
// answered even when the agent cancels it, as the custodian already runs
// the receiver's request to its own deadline (dispatch.go).

// readMethod is what a line must contain to be looked at as a read.
var readMethod = []byte(acp.ClientMethodFsReadTextFile)

// inbound is the SDK's envelope of one JSON-RPC message (its
// anyMessage, less what a request does not use).
type inbound struct {
	JSONRPC string           `json:"jsonrpc"`
	ID      *json.RawMessage `json:"id,omitempty"`
	Method  string           `json:"method,omitempty"`
	Params  json.RawMessage  `json:"params,omitempty"`
}

// outbound is the SDK's envelope of an answer (anyMessage's field order).
type outbound struct {
	JSONRPC string            `json:"jsonrpc"`
	ID      *json.RawMessage  `json:"id,omitempty"`
	Result  json.RawMessage   `json:"result,omitempty"`
	Error   *acp.RequestError `json:"error,omitempty"`
}

// takeRead serves line here if it is an fs/read_text_file request, on a
// goroutine of its own as the SDK serves a request, and reports whether
// it did.
func (ll *Reader) takeRead(line [][]byte) bool {
	if ll.srv == nil || len(line) != 1 || !bytes.Contains(line[0], readMethod) {
		return false
	}
	msg, ok := decodeRead(line[0])
	if !ok {
		return false
	}
	ll.calls.Go(func() { ll.serveRead(msg) })
	return true
}

// decodeRead decodes line as the SDK's receive does; ok is false when it
// is not a request of fs/read_text_file.
func decodeRead(line []byte) (*inbound, bool) {
	msg := new(inbound)
	if err := json.Unmarshal(line, msg); err != nil || msg.ID == nil || msg.Method != acp.ClientMethodFsReadTextFile {
		return nil, false
	}
	return msg, true
}

// serveRead runs a read and writes its answer.
func (ll *Reader) serveRead(msg *inbound) {
	resp, fc, rerr := ll.runRead(msg.Params)
	if fc != nil {
		defer fc.Close()
	}
	if rerr != nil {
		ll.writeAnswer(outbound{JSONRPC: "2.0", ID: msg.ID, Error: rerr})
		return
	}
	head, err := readResultHead(&resp)
	if err != nil { // the SDK's json.Marshal of the result failing
		ll.writeAnswer(outbound{JSONRPC: "2.0", ID: msg.ID, Error: acp.NewInternalError(map[string]any{"error": err.Error()})})
		return
	}
	id, err := json.Marshal(msg.ID) // compacted, HTML-escaped: as the SDK's envelope has it
	if err != nil {
		ll.log.Error("custodian: encode the id of a read", "err", err)
		return
	}
	quoted := quotedString(resp.Content)
	if fc != nil {
		quoted = func(w *bufio.Writer) error { return writeQuotedFile(w, fc) }
	}
	werr := ll.out.Stream(func(w *bufio.Writer) error { return writeReadAnswer(w, id, head, quoted) })
	if werr != nil {
		ll.log.Warn("custodian: answer to a read not written", "err", werr)
	}
}

// writeReadAnswer writes the whole answer line of a read: the SDK's
// envelope with id (already compact) and the result (readResultHead,
// then the content, written by quoted as a JSON string).
func writeReadAnswer(w *bufio.Writer, id, head []byte, quoted func(w *bufio.Writer) error) error {
	w.WriteString(`{"jsonrpc":"2.0","id":`)
	w.Write(id)
	w.WriteString(`,"result":`)
	if err := writeReadResult(w, head, quoted); err != nil {
		return err
	}
	_, err := w.WriteString("}\n")
	return err
}

// runRead decodes, validates and serves the params of a read as the SDK's
// client handler does.
// The content is in resp, or in fc (which the caller closes) when it is
// long.
func (ll *Reader) runRead(params json.RawMessage) (resp acp.ReadTextFileResponse, fc *FileContent, rerr *acp.RequestError) {
	var p acp.ReadTextFileRequest
	if err := json.Unmarshal(params, &p); err != nil {
		return resp, nil, acp.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	if err := p.Validate(); err != nil {
		return resp, nil, acp.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	resp, fc, err := ll.srv.ReadTextFile(context.Background(), p)
	if err != nil {
		return resp, fc, toRequestError(err)
	}
	return resp, fc, nil
}

// toRequestError is the SDK's toReqErr: a *acp.RequestError as it is
// (not unwrapped), a cancellation as request-cancelled, anything else as
// an internal error.
func toRequestError(err error) *acp.RequestError {
	if re, ok := err.(*acp.RequestError); ok { //nolint:errorlint // the SDK's own test, kept identical
		return re
	}
	if errors.Is(err, context.Canceled) {
		return acp.NewRequestCancelled(map[string]any{"error": err.Error()})
	}
	return acp.NewInternalError(map[string]any{"error": err.Error()})
}

// writeAnswer writes a small answer as the SDK's sendMessage does.
func (ll *Reader) writeAnswer(msg outbound) {
	b, err := json.Marshal(msg)
	if err != nil {
		ll.log.Error("custodian: encode the answer to a read", "err", err)
		return
	}
	if _, err := ll.out.Write(append(b, '\n')); err != nil {
		ll.log.Warn("custodian: answer to a read not written", "err", err)
	}
}
