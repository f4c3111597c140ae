package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/tetherdev/tether/receiver/wire"
)

// jsonConn is a receiver connection that speaks no binary frames; it
// keeps the last write_chunk args it was called with.
type jsonConn struct{ last *wire.WriteChunkArgs }

func (j *jsonConn) CallFenced(_ context.Context, _ wire.Op, _, _ string, _ uint64, _ time.Time, args, _ any) error {
	j.last, _ = args.(*wire.WriteChunkArgs)
	return nil
}
func (j *jsonConn) Done() <-chan struct{} { return nil }
func (j *jsonConn) Close() error          { return nil }

// binConn speaks binary frames; it keeps the data of the last chunk.
type binConn struct {
	jsonConn
	data []byte
}

func (b *binConn) CallChunk(_ context.Context, _, _ string, _ uint64, _ time.Time, _ *wire.WriteChunkArgs, data []byte, _ *wire.WriteChunkResult) error {
	b.data = data
	return nil
}
func (b *binConn) BinaryFrames() bool { return true }

// A wakingConn speaks binary frames exactly when the connection it wraps
// does, and over one that does not, a chunk goes as JSON with its data.
func TestWakingConnBinaryFramesFollowTheWrapped(t *testing.T) {
	w := &waker{stderr: io.Discard, last: time.Now().Add(time.Hour)} // no touch: within wakeEvery
	ctx := context.Background()
	args := &wire.WriteChunkArgs{TransferID: "t", Offset: 4}
	plain := &jsonConn{}
	wc := &wakingConn{ReceiverConn: plain, w: w}
	if wc.BinaryFrames() {
		t.Fatal("binary frames claimed over a connection without them")
	}
	if err := wc.CallChunk(ctx, "d", "k", 0, time.Now().Add(time.Minute), args, []byte("abc"), &wire.WriteChunkResult{}); err != nil {
		t.Fatal(err)
	}
	if plain.last == nil || string(plain.last.Data) != "abc" || plain.last.Offset != 4 || args.Data != nil {
		t.Fatalf("JSON fallback sent %+v (args now %+v)", plain.last, args)
	}
	bin := &binConn{}
	wc = &wakingConn{ReceiverConn: bin, w: w}
	if !wc.BinaryFrames() {
		t.Fatal("binary frames not passed on")
	}
	if err := wc.CallChunk(ctx, "d", "k", 0, time.Now().Add(time.Minute), args, []byte("xyz"), &wire.WriteChunkResult{}); err != nil {
		t.Fatal(err)
	}
	if string(bin.data) != "xyz" || bin.last != nil {
		t.Fatalf("binary chunk %q, JSON call %+v", bin.data, bin.last)
	}
}
