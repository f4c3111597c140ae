package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/fsops"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// openRoot opens the grant's root with the effective bounds of grant and
// receiver. The caller closes it.
func (h *Handler) openRoot(g admission.Grant) (*fsops.Root, error) {
	return fsops.OpenRoot(g.Tuple.Root, fsops.Owner{UID: g.UID, GID: g.GID}, fsops.Limits{
		MaxFileBytes:   min64(g.Limits.MaxFileBytes, h.limits.MaxFileBytes),
		MaxListEntries: h.limits.MaxListEntries,
		MaxHashPaths:   h.limits.MaxHashPaths,
	})
}

func (h *Handler) read(g admission.Grant, a *wire.ReadArgs) (*wire.ReadResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	res, err := root.ReadSelect(a.Path, a.Line, a.Limit, h.limits.MaxResultBytes)
	if err != nil {
		return nil, err
	}
	out := &wire.ReadResult{Content: res.Content, Size: res.Size, SHA256: res.SHA256}
	// JSON escapes a byte to at most six: below that bound no encoding is
	// needed to know the answer fits.
	if res.Overflow || 6*len(out.Content)+512 > h.limits.MaxResultBytes && h.fits(out, "") != nil { // the client reads it in chunks
		return &wire.ReadResult{Size: res.Size, SHA256: res.SHA256, Chunked: true}, nil
	}
	return out, nil
}

// readChunk answers at most as many bytes as fit one result in base64.
func (h *Handler) readChunk(g admission.Grant, a *wire.ReadChunkArgs) (*wire.ReadChunkResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	data, size, err := root.ReadAt(a.Path, a.Offset, min(a.Length, h.chunkBound()))
	if err != nil {
		return nil, err
	}
	return &wire.ReadChunkResult{Data: data, Size: size}, nil
}

// chunkBound is the most bytes whose base64 fits one result beside its
// envelope.
func (h *Handler) chunkBound() int64 {
	return int64(h.limits.MaxResultBytes-256) / 4 * 3
}

// writeBegin checks a chunked write as write would and opens its
// unnamed staging file, held by the request's connection.
func (h *Handler) writeBegin(ctx context.Context, req *wire.Request, g admission.Grant, a *wire.WriteBeginArgs) (*wire.WriteBeginResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	st, err := root.Stage(fsops.StageRequest{Path: a.Path, Size: a.Size, SHA256: a.SHA256, Mode: a.Mode,
		ExpectSHA256: a.ExpectSHA256, ExpectAbsent: a.ExpectAbsent})
	if err != nil {
		return nil, err
	}
	t, err := h.transfers.open(req.TupleSHA256, wireserver.ConnOf(ctx), st)
	if err != nil {
		st.Close()
		return nil, err
	}
	return &wire.WriteBeginResult{TransferID: t.id}, nil
}

// writeChunk appends one chunk; a chunk that fails drops the transfer.
func (h *Handler) writeChunk(req *wire.Request, a *wire.WriteChunkArgs) (*wire.WriteChunkResult, error) {
	t, err := h.transfers.get(req.TupleSHA256, a.TransferID)
	if err != nil {
		return nil, err
	}
	if err := t.st.Append(a.Offset, a.Data); err != nil {
		h.transfers.dropLocked(t)
		return nil, err
	}
	n := t.st.Received()
	h.transfers.done(t)
	return &wire.WriteChunkResult{Received: n}, nil
}

// writeEnd commits (write_commit) or drops (write_abort) a transfer; either
// way it is closed.
func (h *Handler) writeEnd(req *wire.Request, g admission.Grant, a *wire.TransferArgs) (any, error) {
	t, err := h.transfers.get(req.TupleSHA256, a.TransferID)
	if err != nil {
		return nil, err
	}
	st := h.transfers.take(t)
	defer st.Close()
	if req.Op == wire.OpWriteAbort {
		return &wire.Empty{}, nil
	}
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	res, err := root.Commit(st)
	if err != nil {
		return nil, err
	}
	return &wire.WriteResult{Size: res.Size, SHA256: res.SHA256}, nil
}

func (h *Handler) write(g admission.Grant, a *wire.WriteArgs) (*wire.WriteResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	res, err := root.Write(fsops.WriteRequest{Path: a.Path, Content: []byte(a.Content), Mode: a.Mode,
		ExpectSHA256: a.ExpectSHA256, ExpectAbsent: a.ExpectAbsent})
	if err != nil {
		return nil, err
	}
	return &wire.WriteResult{Size: res.Size, SHA256: res.SHA256}, nil
}

func (h *Handler) stat(g admission.Grant, a *wire.StatArgs) (*wire.StatResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	info, err := root.Stat(a.Path)
	if err != nil {
		return nil, err
	}
	return &wire.StatResult{Type: info.Type, Size: info.Size, Mode: info.Mode, UID: info.UID, GID: info.GID,
		ModTime: info.ModTime}, nil
}

// list returns the entries that fit in a result; the rest are reported as
// truncated, never silently dropped.
func (h *Handler) list(g admission.Grant, a *wire.ListArgs) (*wire.ListResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	ents, truncated, err := root.List(a.Path)
	if err != nil {
		return nil, err
	}
	out := &wire.ListResult{Entries: make([]wire.DirEntry, 0, len(ents)), Truncated: truncated}
	budget := h.limits.MaxResultBytes - 64
	for _, e := range ents {
		name, _ := json.Marshal(e.Name)
		if budget -= len(name) + 64; budget < 0 {
			out.Truncated = true
			break
		}
		out.Entries = append(out.Entries, wire.DirEntry{Name: e.Name, Type: e.Type, Size: e.Size})
	}
	return out, nil
}

func (h *Handler) hash(g admission.Grant, a *wire.HashArgs) (*wire.HashResult, error) {
	root, err := h.openRoot(g)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	sums, err := root.Hash(a.Paths)
	if err != nil {
		return nil, err
	}
	out := &wire.HashResult{SHA256: sums}
	return out, h.fits(out, "hash result; ask for fewer paths")
}

// fits refuses a result whose encoding exceeds MaxResultBytes.
func (h *Handler) fits(v any, what string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > h.limits.MaxResultBytes {
		return errcode.Errorf(errcode.CodeTooLarge, "%s encodes to %d bytes, limit %d; %s", "result", len(b), h.limits.MaxResultBytes, what)
	}
	return nil
}

// errCodes maps the errors of fsops and spawn onto wire codes.
var errCodes = []struct {
	err  error
	code errcode.Code
}{
	{fsops.ErrEscape, errcode.CodePathEscape},
	{fsops.ErrNotFound, errcode.CodeNotFound},
	{fsops.ErrNotDir, errcode.CodeNotFound},
	{fsops.ErrTooLarge, errcode.CodeTooLarge},
	{fsops.ErrPrecondition, errcode.CodePrecondition},
	{fsops.ErrBusy, errcode.CodeBusy},
	{fsops.ErrHardLink, errcode.CodeDenied},
	{fsops.ErrSymlink, errcode.CodeDenied},
	{fsops.ErrNotRegular, errcode.CodeInvalid},
	{fsops.ErrNotText, errcode.CodeInvalid},
	{fsops.ErrInvalid, errcode.CodeInvalid},
	{fsops.ErrDigest, errcode.CodeInvalid},
	{spawn.ErrCapability, errcode.CodeDenied},
	{spawn.ErrLoaderEnv, errcode.CodeDenied},
	{spawn.ErrSpec, errcode.CodeInvalid},
	{spawn.ErrLandlock, errcode.CodeDenied},
	{fs.ErrNotExist, errcode.CodeNotFound},
	{fs.ErrPermission, errcode.CodeDenied},
	{spawn.ErrStart, errcode.CodeDenied},
}

// toWire gives err its code; an unclassified error is logged and sent as
// internal, so internals never reach the peer.
func (h *Handler) toWire(op wire.Op, err error) error {
	var we *errcode.Error
	if errors.As(err, &we) {
		return we
	}
	for _, m := range errCodes {
		if errors.Is(err, m.err) {
			return errcode.Errorf(m.code, "%s: %v", op, err)
		}
	}
	return h.logInternal(op, err)
}
