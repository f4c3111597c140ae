package vm

// Copy in and out of a VM computer go through its guest: the host never
// mounts or parses the guest's disk. The tar crosses the control port in
// lockstep chunks (ctl copy.go): the guest's PID 1 extracts it beneath
// the grant's root, or writes the tar of a path there, with the same
// archive checks as a namespaced computer's copy. What the guest sends
// is untrusted bytes: each answer is strictly decoded (ctl), a chunk is
// at most ctl.MaxCopyChunk bytes, a copy out at most MaxCopyOutBytes,
// and the receipt's SHA-256 and length are the host's own, over the
// bytes it sent or took; only its file count is the guest's claim.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/vm/ctl"
)

var _ api.GuestCopier = (*Machine)(nil)

// MaxCopyOutBytes caps the tar a copy out takes from a guest, as
// archive.DefaultLimits.MaxStreamBytes caps a tar stream a namespaced
// computer's copy extracts.
const MaxCopyOutBytes = 16 << 30

// abortWait bounds the copy_abort sent after a failed copy.
const abortWait = 10 * time.Second

// callFunc sends one control request (Machine.ctlCall; a fake guest's
// client in tests).
type callFunc func(context.Context, ctl.Request) (ctl.Response, error)

// CopyIn implements api.GuestCopier: the tar r is extracted beneath dir
// of the grant's root by the guest. A stopped (suspended) guest cannot
// answer: conflict.
func (m *Machine) CopyIn(ctx context.Context, dir string, r io.Reader) (api.Transfer, error) {
	if err := m.copyReady(); err != nil {
		return api.Transfer{}, err
	}
	m.copyMu.Lock()
	defer m.copyMu.Unlock()
	return copyIn(ctx, m.ctlCall, dir, r)
}

// CopyOut implements api.GuestCopier: the guest writes the tar of path
// beneath the grant's root, which goes to w. A stopped (suspended) guest
// cannot answer: conflict.
func (m *Machine) CopyOut(ctx context.Context, path string, w io.Writer) (api.Transfer, error) {
	if err := m.copyReady(); err != nil {
		return api.Transfer{}, err
	}
	m.copyMu.Lock()
	defer m.copyMu.Unlock()
	return copyOut(ctx, m.ctlCall, path, w, MaxCopyOutBytes)
}

// copyReady refuses a copy while the guest is stopped.
func (m *Machine) copyReady() error {
	if m.ctl == nil {
		return fmt.Errorf("copy: %w: no control channel", ErrGuest)
	}
	if m.isFrozen() {
		return api.Errorf(api.CodeConflict, "the computer is suspended: its guest is stopped (QMP stop) and cannot "+
			"answer a copy, which goes through it; resume the computer first")
	}
	return nil
}

// copyIn sends r to the guest in chunks and returns the receipt of what
// it sent; on failure the guest's extraction is aborted (it undoes what
// it made).
func copyIn(ctx context.Context, call callFunc, dir string, r io.Reader) (api.Transfer, error) {
	if _, err := call(ctx, ctl.Request{Op: ctl.OpCopyInBegin, Path: dir}); err != nil {
		return api.Transfer{}, copyError(err)
	}
	h := sha256.New()
	n, err := sendChunks(ctx, call, io.TeeReader(r, h))
	var resp ctl.Response
	if err == nil {
		resp, err = call(ctx, ctl.Request{Op: ctl.OpCopyInEnd})
	}
	if err == nil && resp.Files < 0 {
		err = fmt.Errorf("%w: copy_in_end: %d files", ctl.ErrProtocol, resp.Files)
	}
	if err != nil {
		abort(ctx, call)
		return api.Transfer{}, copyError(err)
	}
	return transfer(h, n, resp.Files), nil
}

// sendChunks sends r as copy_in_data chunks and returns the bytes sent.
func sendChunks(ctx context.Context, call callFunc, r io.Reader) (int64, error) {
	buf := make([]byte, ctl.MaxCopyChunk)
	var sent int64
	for {
		if err := ctx.Err(); err != nil { // a call's deadline is ctx's, not its cancellation
			return sent, err
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if _, cerr := call(ctx, ctl.Request{Op: ctl.OpCopyInData, Data: buf[:n]}); cerr != nil {
				return sent, cerr
			}
			sent += int64(n)
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return sent, nil
		case err != nil:
			return sent, fmt.Errorf("copy in: read the stream: %w", err)
		}
	}
}

// copyOut takes the guest's tar of path in chunks into w, at most max
// bytes, and returns the receipt of what it took; on failure the
// guest's tar is aborted.
func copyOut(ctx context.Context, call callFunc, path string, w io.Writer, max int64) (api.Transfer, error) {
	if _, err := call(ctx, ctl.Request{Op: ctl.OpCopyOutBegin, Path: path}); err != nil {
		return api.Transfer{}, copyError(err)
	}
	h := sha256.New()
	n, files, err := takeChunks(ctx, call, io.MultiWriter(w, h), max)
	if err != nil {
		abort(ctx, call)
		return api.Transfer{}, copyError(err)
	}
	return transfer(h, n, files), nil
}

// takeChunks asks for copy_out_data until the guest says done, writing
// each chunk to w; past max bytes the guest is cut off (ErrTooLarge).
func takeChunks(ctx context.Context, call callFunc, w io.Writer, max int64) (n, files int64, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return n, 0, err
		}
		resp, err := call(ctx, ctl.Request{Op: ctl.OpCopyOutData})
		if err != nil {
			return n, 0, err
		}
		chunk, done, files, err := ctl.CopyChunk(resp)
		switch {
		case err != nil:
			return n, 0, err
		case done:
			return n, files, nil
		case n+int64(len(chunk)) > max:
			return n, 0, fmt.Errorf("%w: the guest's tar passes %d bytes", archive.ErrTooLarge, max)
		}
		if _, err := w.Write(chunk); err != nil {
			return n, 0, fmt.Errorf("copy out: write: %w", err)
		}
		n += int64(len(chunk))
	}
}

// abort ends the guest's copy after a failure, best effort: a guest
// that does not answer is reported by the failure itself.
func abort(ctx context.Context, call callFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortWait)
	defer cancel()
	_, _ = call(ctx, ctl.Request{Op: ctl.OpCopyAbort})
}

func transfer(h hash.Hash, n, files int64) api.Transfer {
	return api.Transfer{SHA256: hex.EncodeToString(h.Sum(nil)), Bytes: n, Files: files}
}

// copyError gives a guest's refusal the archive error it names, so the
// service answers it as it answers a namespaced computer's (an unsafe
// entry bad_request, a cap too_large, an existing name conflict); an
// errno maps through ctl.GuestError.Is.
func copyError(err error) error {
	var ge *ctl.GuestError
	if !errors.As(err, &ge) {
		return fmt.Errorf("copy: %w", err)
	}
	switch ge.Refused {
	case ctl.RefusedUnsafe:
		return fmt.Errorf("%w: in the guest: %w", archive.ErrUnsafeEntry, err)
	case ctl.RefusedTooLarge:
		return fmt.Errorf("%w: in the guest: %w", archive.ErrTooLarge, err)
	case ctl.RefusedNotNew:
		return fmt.Errorf("%w: in the guest: %w", archive.ErrNotEmpty, err)
	}
	return fmt.Errorf("copy: in the guest: %w", err)
}
