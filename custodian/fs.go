package custodian

import (
	"context"
	"errors"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// ReadTextFile serves fs/read_text_file from the computer through the
// receiver, never from the host. It is read-only, so it is not keyed
// durably. The response's `_meta["tether/file"]` carries the SHA-256 and
// size of the whole file.
func (h *client) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	cl, err := h.admit(ctx, acp.ClientMethodFsReadTextFile, string(p.SessionId), p.Meta)
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	rel, err := cl.path(p.Path)
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	args := wire.ReadArgs{Path: rel, Line: deref(p.Line), Limit: deref(p.Limit)}
	var res wire.ReadResult
	send := func(ctx context.Context, conn ReceiverConn) error {
		if err := conn.CallFenced(ctx, wire.OpRead, cl.b.digest, cl.op.OpKey, cl.b.fenceToken(), cl.deadline, &args, &res); err != nil || !res.Chunked {
			return err
		}
		whole, err := cl.readChunked(ctx, conn, &args, &res)
		if err == nil {
			res = *whole
		}
		return err
	}
	err = cl.readOnlyWith(ctx, send, func(r *audit.Record) {
		r.Digests = map[string]string{"path": sha256Hex([]byte(rel)), "file": res.SHA256}
		r.Sizes = map[string]int64{"file": res.Size, "content": int64(len(res.Content))}
	})
	var re *acp.RequestError
	if errors.As(err, &re) {
		// A missing file is answered the way ACP defines it (-32002), so
		// an agent that reads before it writes can create a new file.
		return acp.ReadTextFileResponse{}, acpmeta.ResourceNotFound(re, p.Path)
	}
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	return acp.ReadTextFileResponse{Content: res.Content,
		Meta: acpmeta.File{SHA256: res.SHA256, Size: res.Size}.Meta()}, nil
}

// WriteTextFile serves fs/write_text_file: keyed (at most once per op key),
// with `_meta["tether/expect"]` passed to the receiver as an atomic
// precondition. The receipt is verified when the receiver reports the
// written file's digest equal to the content's.
func (h *client) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
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
		cl.refuse(errcode.CodeInvalid)
		return acp.WriteTextFileResponse{}, acpmeta.NewError(errcode.CodeInvalid, "%v", err)
	}
	args := wire.WriteArgs{Path: rel, Content: p.Content, ExpectSHA256: exp.SHA256, ExpectAbsent: exp.Absent}
	want := sha256String(p.Content) // no copy of a content of up to 64 MiB
	var res wire.WriteResult
	var send func(context.Context, ReceiverConn) error
	if len(p.Content) > singleWriteMax { // more than one frame may hold: in chunks
		send = func(ctx context.Context, conn ReceiverConn) error {
			return cl.sendChunked(ctx, conn, &args, p.Content, want, &res)
		}
	}
	raw, err := cl.keyed(ctx, keyed{op: wire.OpWrite, args: &args, result: &res, digestArgs: writeDigestArgs(&args, want), send: send,
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
			r.Sizes = map[string]int64{"content": int64(len(p.Content))}
		},
	})
	return decodeResponse[acp.WriteTextFileResponse](raw, err)
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
		code, _ := acpmeta.CodeOf(err)
		cl.refuse(code)
	}
	return rel, err
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
