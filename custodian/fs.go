package custodian

import (
	"context"
	"errors"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/longline"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// ReadTextFile serves fs/read_text_file from the computer through the
// receiver, never from the host. It changes nothing, so it is keyed
// without a durable write before it is sent (keyed.idempotent): its
// receipt keeps the answer, and a retry with the same op key and
// arguments gets the content first read, byte for byte, and reads nothing
// (an edit's retry applies the same edit to the same content). A plain
// agent's read is not keyed: its key is one the custodian minted for
// this request alone, which no retry can name, so a receipt would only
// keep the content. The response's `_meta["tether/file"]` carries the
// SHA-256 and size of the whole file.
func (h *client) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	resp, fc, err := h.readTextFile(ctx, p)
	if fc != nil { // the SDK answers from a string: read the spool back whole
		defer fc.Close()
		if resp.Content, err = fc.String(); err != nil {
			return acp.ReadTextFileResponse{}, refusal(err)
		}
	}
	return resp, err
}

// readTextFile serves fs/read_text_file (ReadTextFile); a long selection
// of a file read in chunks comes in fc, which the caller closes (then
// resp.Content is empty).
func (h *client) readTextFile(ctx context.Context, p acp.ReadTextFileRequest) (resp acp.ReadTextFileResponse, fc *longline.FileContent, err error) {
	cl, err := h.admit(ctx, acp.ClientMethodFsReadTextFile, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.ReadTextFileResponse{}, nil, err
	}
	rel, err := cl.path(p.Path)
	if err != nil {
		return acp.ReadTextFileResponse{}, nil, err
	}
	args := wire.ReadArgs{Path: rel, Line: deref(p.Line), Limit: deref(p.Limit)}
	var res wire.ReadResult
	send := func(ctx context.Context, conn ReceiverConn) error {
		if fc != nil { // sent again: the last try's spool goes
			fc.Close()
			fc = nil
		}
		if err := conn.CallFenced(ctx, wire.OpRead, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, &args, &res); err != nil || !res.Chunked {
			return err
		}
		whole, wfc, err := cl.readChunked(ctx, conn, &args, &res)
		if err == nil {
			res, fc = *whole, wfc
		}
		return err
	}
	answer := func() acp.ReadTextFileResponse {
		return acp.ReadTextFileResponse{Content: res.Content, Meta: acpmeta.File{SHA256: res.SHA256, Size: res.Size}.Meta()}
	}
	annotate := func(r *audit.Record) {
		n := int64(len(res.Content))
		if fc != nil {
			n = fc.Len()
		}
		r.Digests = map[string]string{"path": sha256Hex([]byte(rel)), "file": res.SHA256}
		r.Sizes = map[string]int64{"file": res.Size, "content": n}
	}
	if cl.TaggedBy == TaggedByCustodian {
		if err = cl.readOnlyWith(ctx, send, annotate); err == nil {
			resp = answer()
		}
	} else {
		resp, err = cl.keyedRead(ctx, &args, &res, send, rel, answer, annotate, func() *longline.FileContent { return fc })
	}
	if err != nil && fc != nil {
		fc.Close()
		fc = nil
	}
	var re *acp.RequestError
	if errors.As(err, &re) {
		// A missing file is answered the way ACP defines it (-32002), so
		// an agent that reads before it writes can create a new file.
		return acp.ReadTextFileResponse{}, nil, acperr.ResourceNotFound(re, p.Path)
	}
	return resp, fc, err
}

// keyedRead sends a read keyed by its op key (ReadTextFile) and returns
// its answer: the one answer builds from res, or the receipt's on a
// replay. spooled returns the long content read now, if any: such an
// answer is never kept in a receipt.
func (cl *call) keyedRead(ctx context.Context, args *wire.ReadArgs, res *wire.ReadResult, send func(context.Context, ReceiverConn) error,
	rel string, answer func() acp.ReadTextFileResponse, annotate func(*audit.Record), spooled func() *longline.FileContent) (acp.ReadTextFileResponse, error) {
	var fresh *acp.ReadTextFileResponse // the answer read now; nil for a replay
	raw, err := cl.keyed(ctx, keyed{op: wire.OpRead, args: args, result: res, send: send, idempotent: true,
		settle: func() (any, *opstore.Receipt) {
			a := answer()
			fresh = &a
			return fresh, &opstore.Receipt{Outcome: opstore.NeedsReview}
		},
		annotate: func(r *audit.Record) {
			r.Digests = map[string]string{"path": sha256Hex([]byte(rel))}
		},
		annotateResult: annotate,
		tooLong: func(resp any) (int64, bool) {
			return readTooLong(resp.(*acp.ReadTextFileResponse), spooled())
		},
	})
	if err == nil && fresh != nil {
		return *fresh, nil // what the receipt holds, not decoded back
	}
	return decodeResponse[acp.ReadTextFileResponse](raw, err)
}

// readTooLong reports whether a read's answer a, its content in a or in
// fc, is surely too long for a receipt (its content alone longer than any
// receipt), and then its JSON's length, counted without making it.
func readTooLong(a *acp.ReadTextFileResponse, fc *longline.FileContent) (int64, bool) {
	if fc == nil && !opstore.ResponseNeverFits(int64(len(a.Content))) {
		return 0, false // json.Marshal and Receipt.Fits decide
	}
	n, err := longline.ReadResultLen(a, fc)
	if err != nil && fc != nil {
		return fc.Len(), true // the spool could not be read back: at least this long, and its answer fails
	}
	return n, err == nil // an error: json.Marshal reports it
}

// WriteTextFile serves fs/write_text_file: keyed (at most once per op key),
// with `_meta["tether/expect"]` passed to the receiver as an atomic
// precondition. The receipt is verified when the receiver reports the
// written file's digest equal to the content's.
func (h *client) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return h.writeTextFile(ctx, p, writeContent{s: p.Content})
}

// writeTextFile serves fs/write_text_file of content wc (p.Content is
// the content of a short write only).
func (h *client) writeTextFile(ctx context.Context, p acp.WriteTextFileRequest, wc writeContent) (acp.WriteTextFileResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodFsWriteTextFile, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	rel, err := cl.path(p.Path)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	exp, _, err := acpmeta.ExpectFromMeta(p.Meta)
	if err != nil {
		cl.Refuse(errcode.CodeInvalid)
		return acp.WriteTextFileResponse{}, acperr.NewError(errcode.CodeInvalid, "%v", err)
	}
	if wc.long != nil && wc.size() <= singleWriteMax { // a long line with a short content: sent whole
		wc = wc.materialize()
	}
	args := wire.WriteArgs{Path: rel, Content: wc.s, ExpectSHA256: exp.SHA256, ExpectAbsent: exp.Absent}
	want := wc.sha256() // no copy of a content of up to 64 MiB
	size := wc.size()
	var res wire.WriteResult
	var send func(context.Context, ReceiverConn) error
	if size > singleWriteMax { // more than one frame may hold: in chunks
		send = func(ctx context.Context, conn ReceiverConn) error {
			return cl.sendChunked(ctx, conn, &args, wc, want, &res)
		}
	}
	dargs := writeDigestArgs(&args, want)
	dargs.ContentBytes = int(size)
	raw, err := cl.keyed(ctx, keyed{op: wire.OpWrite, args: &args, result: &res, digestArgs: dargs, send: send,
		settle: func() (any, *opstore.Receipt) {
			outcome := opstore.Verified
			if res.SHA256 != want {
				outcome = opstore.Failed
			}
			return acp.WriteTextFileResponse{Meta: acpmeta.File{SHA256: res.SHA256, Size: res.Size}.Meta()},
				&opstore.Receipt{Outcome: outcome, Files: []opstore.FileCheck{{Path: rel, Expected: want, Actual: res.SHA256}}}
		},
		annotate: func(r *audit.Record) {
			r.Digests = map[string]string{"path": sha256Hex([]byte(rel)), "content": want}
			r.Sizes = map[string]int64{"content": size}
		},
	})
	return decodeResponse[acp.WriteTextFileResponse](raw, err)
}

// writeContent is a write's content: a string s, or a long write's
// content decoded from its line as it is sent (long), never held whole.
type writeContent struct {
	s    string
	long *longline.Content
}

func (wc writeContent) size() int64 {
	if wc.long != nil {
		return wc.long.Len()
	}
	return int64(len(wc.s))
}

// sha256 is the content's hex SHA-256 (a long content's was taken as it
// was decoded).
func (wc writeContent) sha256() string {
	if wc.long != nil {
		return wc.long.SHA256()
	}
	return sha256String(wc.s)
}

// chunks calls fn with the content in pieces of at most cap(buf) bytes,
// in order, through buf (fn must not keep p).
func (wc writeContent) chunks(buf []byte, fn func(p []byte) error) error {
	if wc.long != nil {
		return wc.long.Chunks(buf, fn)
	}
	n := cap(buf)
	for off := 0; off < len(wc.s); off += n {
		if err := fn(append(buf[:0], wc.s[off:min(off+n, len(wc.s))]...)); err != nil {
			return err
		}
	}
	return nil
}

// materialize returns wc as a string (a short content).
func (wc writeContent) materialize() writeContent {
	var b strings.Builder
	b.Grow(int(wc.size()))
	_ = wc.chunks(make([]byte, 0, 64<<10), func(p []byte) error { b.Write(p); return nil })
	return writeContent{s: b.String()}
}

// writeDigest is what a write's request digest covers: every field of its
// args, with the content standing as its SHA-256 (already computed for the
// receipt), so the content is not JSON-encoded once more on the hot path.
type writeDigest struct {
	Path          string `json:"path"`
	ContentSHA256 string `json:"content_sha256"`
	ContentBytes  int    `json:"content_bytes"`
	Mode          uint32 `json:"mode,omitempty"`
	ExpectSHA256  string `json:"expect_sha256,omitempty"`
	ExpectAbsent  bool   `json:"expect_absent,omitempty"`
}

func writeDigestArgs(a *wire.WriteArgs, contentSHA256 string) *writeDigest {
	return &writeDigest{Path: a.Path, ContentSHA256: contentSHA256, ContentBytes: len(a.Content), Mode: a.Mode,
		ExpectSHA256: a.ExpectSHA256, ExpectAbsent: a.ExpectAbsent}
}

// path maps an ACP path onto the binding's root, auditing a refusal.
func (cl *call) path(p string) (string, error) {
	rel, err := relPath(cl.b.Tuple.Root, p)
	if err != nil {
		code, _ := acperr.CodeOf(err)
		cl.Refuse(code)
	}
	return rel, err
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
