package custodian

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/longline"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// Files larger than one frame move in chunks (docs/protocol.md "Chunked
// files"): a write as write_begin, write_chunk... and write_commit, a read
// whose selection does not fit one answer as read_chunk at offsets.

// singleWriteMax is the largest content a write sends in one `write`
// request: JSON escaping can grow it six times, and it must fit a frame.
const singleWriteMax = 128 << 10

// chunkSize is the content of one chunk on conn: wire.MaxChunkBytes, or
// less when the client's frame limit is lower, so a chunk in base64 with
// its envelope always fits one frame.
func chunkSize(conn ReceiverConn) int {
	n := wire.MaxChunkBytes
	if f, ok := conn.(interface{ MaxFrame() int }); ok {
		n = min(n, (f.MaxFrame()-1024)/4*3)
	}
	return max(n, 1)
}

// binaryConn is a connection that sends write_chunk as a binary frame
// (wireclient.Client; docs/protocol.md "Binary data frames"). On one
// whose BinaryFrames is true, chunks move raw, and read_chunk asks for
// binary answers (a wrapper says true only when what it wraps does).
type binaryConn interface {
	CallChunk(ctx context.Context, tupleSHA256, opKey string, fence uint64, deadline time.Time,
		args *wire.WriteChunkArgs, data []byte, result *wire.WriteChunkResult) error
	BinaryFrames() bool
}

// binaryOf returns conn as a binaryConn when it speaks binary frames.
func binaryOf(conn ReceiverConn) (binaryConn, bool) {
	bc, ok := conn.(binaryConn)
	return bc, ok && bc.BinaryFrames()
}

var _ binaryConn = (*wireclient.Client)(nil)

// errBeforeCommit marks a chunked write that ended before its commit was
// sent: the file is unchanged for certain.
type errBeforeCommit struct {
	err        error
	sent, size int64
}

func (e *errBeforeCommit) Error() string {
	return fmt.Sprintf("the transfer broke after %d of %d bytes, before its commit; the file is unchanged: %v", e.sent, e.size, e.err)
}

func (e *errBeforeCommit) Unwrap() error { return e.err }

// sendChunked writes content wc (of SHA-256 sum) through a transfer on
// conn and decodes the commit's answer into res. A failure before the
// commit drops the transfer (write_abort, best effort; the receiver also
// drops it when the connection ends or it idles) and is an
// *errBeforeCommit.
func (cl *call) sendChunked(ctx context.Context, conn ReceiverConn, a *wire.WriteArgs, wc writeContent, sum string, res *wire.WriteResult) error {
	call := func(op wire.Op, args, result any) error {
		return conn.CallFenced(ctx, op, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, args, result)
	}
	var b wire.WriteBeginResult
	bc, binary := binaryOf(conn)
	size := wc.size()
	begin := wire.WriteBeginArgs{Path: a.Path, Size: size, SHA256: sum, Mode: a.Mode,
		ExpectSHA256: a.ExpectSHA256, ExpectAbsent: a.ExpectAbsent, Binary: binary}
	if err := call(wire.OpWriteBegin, &begin, &b); err != nil {
		return err // nothing staged if it ran; the receiver drops it with the connection otherwise
	}
	off := int64(0)
	// One chunk's buffer, reused: never the whole content's copy.
	err := wc.chunks(make([]byte, 0, chunkSize(conn)), func(chunk []byte) error {
		var err error
		if binary {
			err = bc.CallChunk(ctx, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline,
				&wire.WriteChunkArgs{TransferID: b.TransferID, Offset: off}, chunk, &wire.WriteChunkResult{})
		} else {
			err = call(wire.OpWriteChunk, &wire.WriteChunkArgs{TransferID: b.TransferID, Offset: off, Data: chunk}, &wire.WriteChunkResult{})
		}
		if err != nil {
			return err
		}
		if off == 0 {
			cl.step(ctx, "after-first-chunk")
		}
		off += int64(len(chunk))
		return nil
	})
	if err != nil {
		cl.abortTransfer(conn, b.TransferID)
		return &errBeforeCommit{err: err, sent: off, size: size}
	}
	return call(wire.OpWriteCommit, &wire.TransferArgs{TransferID: b.TransferID}, res)
}

// abortTransfer drops a transfer on the receiver, best effort.
func (cl *call) abortTransfer(conn ReceiverConn, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	_ = conn.CallFenced(ctx, wire.OpWriteAbort, cl.b.Digest, newKey("abort"), cl.b.FenceToken(), dl, &wire.TransferArgs{TransferID: id}, &wire.Empty{})
}

// maxPresize bounds the room a chunked read reserves before the bytes
// arrive (the default max_file_bytes); a larger file grows as it comes.
const maxPresize = 64 << 20

// maxReadAttempts bounds how often a chunked read starts again when the
// file changed between its pieces.
const maxReadAttempts = 3

// readChunked reads the whole file rel in chunks after a read answered
// chunked (first), checks the bytes against the digest that read gave,
// checks the text and selects lines [line, line+limit) as the receiver
// would. A file that changed in between is read again from a fresh
// `read`, at most maxReadAttempts times in all; then it is busy. A file
// longer than spoolMin is read into a spool file (readSpooled), and a
// long selection comes back in fc (res.Content empty), which the caller
// closes.
func (cl *call) readChunked(ctx context.Context, conn ReceiverConn, args *wire.ReadArgs, first *wire.ReadResult) (res *wire.ReadResult, fc *longline.FileContent, err error) {
	cur := first
	for attempt := 1; ; attempt++ {
		res, fc, same, err := cl.readWhole(ctx, conn, args, cur)
		if err != nil || same {
			return res, fc, err
		}
		if attempt == maxReadAttempts {
			return nil, nil, acperr.NewError(errcode.CodeBusy, "read %q: the file changed while it was read in chunks, %d times; retry", args.Path, attempt)
		}
		var again wire.ReadResult
		if err := conn.CallFenced(ctx, wire.OpRead, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, args, &again); err != nil {
			return nil, nil, err
		}
		if !again.Chunked {
			return &again, nil, nil
		}
		cur = &again
	}
}

// readWhole reads the cur.Size bytes of args.Path in chunks and selects
// from them; same is false when they are not those of cur.SHA256.
func (cl *call) readWhole(ctx context.Context, conn ReceiverConn, args *wire.ReadArgs, cur *wire.ReadResult) (*wire.ReadResult, *longline.FileContent, bool, error) {
	if cur.Size > spoolMin {
		return cl.readSpooled(ctx, conn, args, cur)
	}
	data, sum, err := cl.fetchChunks(ctx, conn, args.Path, cur.Size)
	if err != nil || sum != cur.SHA256 {
		return nil, nil, false, err
	}
	if !utf8.ValidString(data) {
		return nil, nil, false, acperr.NewError(errcode.CodeInvalid, "read %q: the file is not valid UTF-8 text", args.Path)
	}
	return &wire.ReadResult{Content: selectLines(data, args.Line, args.Limit), Size: cur.Size, SHA256: cur.SHA256}, nil, true, nil
}

// fetchChunks reads size bytes of rel with read_chunk and returns them
// with their hex SHA-256, hashed as they arrive. The bytes are assembled
// once, in a strings.Builder whose String is not a second copy; a file
// that is shorter or longer now reads as changed (the digest check
// catches it).
func (cl *call) fetchChunks(ctx context.Context, conn ReceiverConn, rel string, size int64) (string, string, error) {
	var buf strings.Builder
	buf.Grow(int(min(size, maxPresize))) // the receiver's size: trusted only this far before bytes arrive
	sum, err := cl.fetchChunksTo(ctx, conn, rel, size, func(p []byte) error {
		buf.Write(p)
		return nil
	})
	if err != nil {
		return "", "", err
	}
	return buf.String(), sum, nil
}

// fetchChunksTo reads size bytes of rel with read_chunk, gives them to
// sink in order (sink must not keep them) and returns their hex SHA-256.
// A file that changed size ends the reading early (the digest tells).
func (cl *call) fetchChunksTo(ctx context.Context, conn ReceiverConn, rel string, size int64, sink func(p []byte) error) (string, error) {
	h := sha256.New()
	n := int64(chunkSize(conn))
	_, binary := binaryOf(conn)
	for off := int64(0); off < size; {
		var ch wire.ReadChunkResult
		args := wire.ReadChunkArgs{Path: rel, Offset: off, Length: min(n, size-off), Binary: binary}
		if err := conn.CallFenced(ctx, wire.OpReadChunk, cl.b.Digest, cl.Op.OpKey, cl.b.FenceToken(), cl.Deadline, &args, &ch); err != nil {
			return "", err
		}
		if len(ch.Data) == 0 || ch.Size != size {
			break // the file changed size: the digest tells
		}
		h.Write(ch.Data)
		if err := sink(ch.Data); err != nil {
			return "", err
		}
		off += int64(len(ch.Data))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// selectLines returns limit lines from the 1-based line (0 = 1); limit 0
// means to the end. Lines keep their newline (receiver/fsops does the same).
func selectLines(data string, line, limit int) string {
	start := 0
	for i := 1; i < line; i++ {
		nl := strings.IndexByte(data[start:], '\n')
		if nl < 0 {
			return ""
		}
		start += nl + 1
	}
	if limit == 0 {
		return data[start:]
	}
	end := start
	for i := 0; i < limit && end < len(data); i++ {
		nl := strings.IndexByte(data[end:], '\n')
		if nl < 0 {
			return data[start:]
		}
		end += nl + 1
	}
	return data[start:end]
}
