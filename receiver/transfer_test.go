package receiver

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// bigGrant is the fixture's main grant with a larger max_file_bytes.
func bigGrant(f *fixture, max int64) admission.Grant {
	g := f.grant
	g.Limits.MaxFileBytes = max
	f.publish(g)
	f.grant = g
	return g
}

// writeChunked writes content through write_begin, write_chunk and
// write_commit on cl.
func (c *conns) writeChunked(t *testing.T, cl *wireclient.Client, path string, content []byte) (wire.WriteResult, error) {
	t.Helper()
	var b wire.WriteBeginResult
	if err := c.call(cl, wire.OpWriteBegin, wire.WriteBeginArgs{Path: path, Size: int64(len(content)), SHA256: hexSHA(content)}, &b); err != nil {
		return wire.WriteResult{}, err
	}
	for off := 0; off < len(content); off += wire.MaxChunkBytes {
		var r wire.WriteChunkResult
		chunk := content[off:min(off+wire.MaxChunkBytes, len(content))]
		if err := c.call(cl, wire.OpWriteChunk, wire.WriteChunkArgs{TransferID: b.TransferID, Offset: int64(off), Data: chunk}, &r); err != nil {
			return wire.WriteResult{}, err
		}
		if r.Received != int64(off+len(chunk)) {
			t.Fatalf("received %d after %d bytes", r.Received, off+len(chunk))
		}
	}
	var res wire.WriteResult
	err := c.call(cl, wire.OpWriteCommit, wire.TransferArgs{TransferID: b.TransferID}, &res)
	return res, err
}

// TestIntegrationChunkedFiles: over a real wire connection a file of
// several frames is written in chunks and read back (read says chunked,
// read_chunk at offsets gives the bytes), byte-identical with the digest
// both sides agree on; read's line and limit still answer in one frame.
func TestIntegrationChunkedFiles(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	bigGrant(f, 8<<20)
	c := newConns(f)
	cl := c.open()
	content := bytes.Repeat([]byte("line of text é\n"), 200_000) // 3.2 MB, 4+ frames
	res, err := c.writeChunked(t, cl, "big.txt", content)
	if err != nil || res.Size != int64(len(content)) || res.SHA256 != hexSHA(content) {
		t.Fatalf("chunked write = %+v, %v", res, err)
	}
	var rr wire.ReadResult
	if err := c.call(cl, wire.OpRead, wire.ReadArgs{Path: "big.txt"}, &rr); err != nil {
		t.Fatal(err)
	}
	if !rr.Chunked || rr.Content != "" || rr.Size != int64(len(content)) || rr.SHA256 != hexSHA(content) {
		t.Fatalf("read of the whole file = chunked %v, %d content bytes, size %d", rr.Chunked, len(rr.Content), rr.Size)
	}
	var got []byte
	for off := int64(0); off < rr.Size; {
		var ch wire.ReadChunkResult
		if err := c.call(cl, wire.OpReadChunk, wire.ReadChunkArgs{Path: "big.txt", Offset: off, Length: wire.MaxChunkBytes}, &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Data) == 0 {
			t.Fatalf("empty chunk at %d", off)
		}
		got = append(got, ch.Data...)
		off += int64(len(ch.Data))
	}
	if !bytes.Equal(got, content) {
		t.Fatal("chunks read back differ from the content written")
	}
	rr = wire.ReadResult{}
	if err := c.call(cl, wire.OpRead, wire.ReadArgs{Path: "big.txt", Line: 199_999, Limit: 5}, &rr); err != nil {
		t.Fatal(err)
	}
	if rr.Chunked || rr.Content != "line of text é\nline of text é\n" || rr.SHA256 != hexSHA(content) {
		t.Fatalf("read of two last lines = %+v", rr)
	}
}

// TestIntegrationChunkedWriteRefusals: a declared size or a chunk past
// max_file_bytes is too_large (the chunk drops the transfer); the per-tuple
// bound of open transfers; another tuple cannot touch a transfer; a
// connection that ends drops its transfers, leaving the old file and no
// staging entry.
func TestIntegrationChunkedWriteRefusals(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	g := bigGrant(f, 1<<20)
	c := newConns(f)
	cl := c.open()
	var b wire.WriteBeginResult
	if err := c.call(cl, wire.OpWriteBegin, wire.WriteBeginArgs{Path: "f", Size: 1<<20 + 1, SHA256: hexSHA(nil)}, &b); code(err) != errcode.CodeTooLarge {
		t.Fatalf("begin over max_file_bytes: %v", err)
	}
	if err := c.call(cl, wire.OpWriteBegin, wire.WriteBeginArgs{Path: "f", Size: 10, SHA256: hexSHA(nil)}, &b); err != nil {
		t.Fatal(err)
	}
	over := wire.WriteChunkArgs{TransferID: b.TransferID, Data: make([]byte, 11)}
	if err := c.call(cl, wire.OpWriteChunk, over, &wire.WriteChunkResult{}); code(err) != errcode.CodeTooLarge {
		t.Fatalf("chunk past the declared size: %v", err)
	}
	over.Data = make([]byte, 1)
	if err := c.call(cl, wire.OpWriteChunk, over, &wire.WriteChunkResult{}); code(err) != errcode.CodeNotFound {
		t.Fatalf("chunk after a refused chunk: %v, want not_found (the transfer was dropped)", err)
	}
	for i := range MaxTransfersPerTuple {
		if err := c.call(cl, wire.OpWriteBegin, wire.WriteBeginArgs{Path: "f", Size: 1, SHA256: hexSHA([]byte("x"))}, &b); err != nil {
			t.Fatalf("begin %d: %v", i, err)
		}
	}
	if err := c.call(cl, wire.OpWriteBegin, wire.WriteBeginArgs{Path: "f", Size: 1, SHA256: hexSHA([]byte("x"))}, &b); code(err) != errcode.CodeDenied {
		t.Fatalf("begin past the per-tuple bound: %v", err)
	}
	other := f.newGrant("other", allOps...)
	f.publish(g, other)
	_, err := f.call(other, wire.OpWriteChunk, wire.WriteChunkArgs{TransferID: b.TransferID, Data: []byte("x")})
	if code(err) != errcode.CodeNotFound {
		t.Fatalf("another tuple's chunk: %v", err)
	}
	if err := os.WriteFile(filepath.Join(g.Tuple.Root, "f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cl.Close() // ends the connection: every transfer it opened is dropped
	deadline := time.Now().Add(10 * time.Second)
	for f.h.transfers.count() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d transfers still open after their connection ended", f.h.transfers.count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, _ := os.ReadFile(filepath.Join(g.Tuple.Root, "f")); string(got) != "old" {
		t.Fatalf("file = %q after dropped transfers", got)
	}
	ents, _ := os.ReadDir(g.Tuple.Root)
	if len(ents) != 1 {
		t.Fatalf("root holds %d entries, want only f", len(ents))
	}
}

// TestChunkedWriteContentMismatch: a commit whose bytes do not match the
// declared digest is invalid and changes nothing.
func TestChunkedWriteContentMismatch(t *testing.T) {
	testenv.Require(t, "root")
	f := newFixture(t, Options{})
	content := make([]byte, 1000)
	rand.Read(content)
	res, err := f.call(f.grant, wire.OpWriteBegin, wire.WriteBeginArgs{Path: "m", Size: 1000, SHA256: hexSHA(content)})
	if err != nil {
		t.Fatal(err)
	}
	id := res.(*wire.WriteBeginResult).TransferID
	content[0] ^= 1
	if _, err := f.call(f.grant, wire.OpWriteChunk, wire.WriteChunkArgs{TransferID: id, Data: content}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.call(f.grant, wire.OpWriteCommit, wire.TransferArgs{TransferID: id}); code(err) != errcode.CodeInvalid {
		t.Fatalf("commit of other bytes: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.grant.Tuple.Root, "m")); !os.IsNotExist(err) {
		t.Fatalf("m exists: %v", err)
	}
}
