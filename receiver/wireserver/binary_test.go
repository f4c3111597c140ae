package wireserver

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/internal/socktest"
	"github.com/tetherdev/tether/receiver/wire"
	"github.com/tetherdev/tether/receiver/wireclient"
)

// chunkHandler keeps the last write_chunk's data and answers read_chunk
// with it.
type chunkHandler struct{ last []byte }

func (h *chunkHandler) Serve(ctx context.Context, req *wire.Request) (any, error) {
	args, err := req.DecodeArgs()
	if err != nil {
		return nil, err
	}
	switch a := args.(type) {
	case *wire.WriteChunkArgs:
		h.last = a.Data
		return &wire.WriteChunkResult{Received: a.Offset + int64(len(a.Data))}, nil
	case *wire.ReadChunkArgs:
		return &wire.ReadChunkResult{Data: h.last[:a.Length], Size: int64(len(h.last))}, nil
	}
	return nil, errcode.Errorf(errcode.CodeInvalid, "unexpected op %s", req.Op)
}

// A chunk goes out and comes back raw in binary frames, a full-size one
// included, and a read_chunk that does not ask for binary gets JSON.
func TestBinaryChunkRoundTrip(t *testing.T) {
	h := &chunkHandler{}
	cl, _ := pair(t, h, ServerConfig{})
	data := bytes.Repeat([]byte{0, 0xff, 'a', '\n'}, wire.MaxChunkBytes/4)
	var wr wire.WriteChunkResult
	err := cl.CallChunk(testCtx(t), testDigest, testOpKey, 0, soon(), &wire.WriteChunkArgs{TransferID: "t", Offset: 3}, data, &wr)
	if err != nil || wr.Received != int64(3+len(data)) || !bytes.Equal(h.last, data) {
		t.Fatalf("write: %v, received %d, handler saw %d bytes", err, wr.Received, len(h.last))
	}
	for _, bin := range []bool{true, false} {
		var rd wire.ReadChunkResult
		args := &wire.ReadChunkArgs{Path: "f", Length: int64(len(data)), Binary: bin}
		if err := cl.Call(testCtx(t), wire.OpReadChunk, testDigest, testOpKey, soon(), args, &rd); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rd.Data, data) || rd.Size != int64(len(data)) {
			t.Fatalf("binary %v: read %d bytes size %d", bin, len(rd.Data), rd.Size)
		}
	}
	// Binary args with data of their own are refused unsent.
	err = cl.CallChunk(testCtx(t), testDigest, testOpKey, 0, soon(), &wire.WriteChunkArgs{TransferID: "t", Data: []byte("x")}, data, &wr)
	if codeOf(err) != errcode.CodeInvalid {
		t.Fatalf("args with data: %v", err)
	}
}

// A binary frame whose data does not match its digest is a protocol
// violation: a notice naming it, then the connection closes.
func TestBinaryFrameBadDigestClosesConnection(t *testing.T) {
	cc, sc := socktest.Pair(t)
	srv, err := NewServer(&chunkHandler{}, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), sc) }()
	peer := newRawPeer(t, cc)
	req := wire.Request{ID: 1, Op: wire.OpWriteChunk, TupleSHA256: testDigest, OpKey: testOpKey, Deadline: soon(),
		Args: []byte(`{"transfer_id":"t","offset":0}`)}
	frame, err := wire.EncodeBinaryRequest(&req, []byte("data"))
	if err != nil {
		t.Fatal(err)
	}
	frame[len(frame)-1] ^= 1
	peer.sendRaw(frame)
	var notice wire.Response
	peer.next(&notice)
	if notice.ID != 0 || notice.Error == nil || notice.Error.Code != errcode.CodeInvalid {
		t.Fatalf("notice %+v", notice)
	}
	peer.expectEOF()
	if err := <-served; !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("served: %v", err)
	}
}

// A binary answer the call did not ask for (a read_chunk without Binary)
// ends the connection as a protocol violation; the call's fate is unknown.
func TestClientRefusesUnaskedBinaryAnswer(t *testing.T) {
	for _, asked := range []bool{false, true} {
		cc, sc := socktest.Pair(t)
		cl, _ := wireclient.NewClient(cc, wireclient.ClientConfig{})
		peer := newRawPeer(t, sc)
		done := make(chan error, 1)
		var rd wire.ReadChunkResult
		go func() {
			done <- cl.Call(testCtx(t), wire.OpReadChunk, testDigest, testOpKey, soon(),
				&wire.ReadChunkArgs{Path: "f", Length: 1, Binary: asked}, &rd)
		}()
		var req wire.Request
		peer.next(&req)
		answer, _ := wire.EncodeBinaryReadChunk(req.ID, &wire.ReadChunkResult{Data: []byte("x"), Size: 1})
		peer.sendRaw(answer)
		err := <-done
		switch {
		case asked && (err != nil || string(rd.Data) != "x"): // positive control
			t.Fatalf("asked: %v, data %q", err, rd.Data)
		case !asked && (codeOf(err) != errcode.CodeFateUnknown || !errors.Is(cl.Err(), wire.ErrProtocol)):
			t.Fatalf("unasked: %v, Err %v", err, cl.Err())
		}
		cl.Close()
	}
}
