package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net"
	"sync"
	"testing"

	"github.com/tetherdev/tether/computer/archive"
	"github.com/tetherdev/tether/computer/vm/ctl"
)

// fakeGuest is the guest's end of the control port for the host's copy
// code: answer answers each request; every op it saw is kept.
type fakeGuest struct {
	mu     sync.Mutex
	ops    []ctl.Op
	answer func(ctl.Request) ctl.Response
}

// serve runs g on one end of a pipe and returns the host's call on the
// other, over the real line protocol. The pipe closes at the test's end.
func (g *fakeGuest) serve(t *testing.T) callFunc {
	host, guest := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ctl.Serve(guest, func(r ctl.Request) ctl.Response {
			g.mu.Lock()
			g.ops = append(g.ops, r.Op)
			g.mu.Unlock()
			return g.answer(r)
		})
	}()
	c := ctl.NewClient(host)
	t.Cleanup(func() { c.Close(); guest.Close(); <-done })
	return c.Call
}

func (g *fakeGuest) saw(op ctl.Op) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, o := range g.ops {
		if o == op {
			n++
		}
	}
	return n
}

func digest(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// TestCopyInChunks: the host sends the stream in chunks of at most
// ctl.MaxCopyChunk bytes, in order, after the begin and before the end;
// the receipt's digest and length are of what it sent, the file count
// the guest's.
func TestCopyInChunks(t *testing.T) {
	var got bytes.Buffer
	g := &fakeGuest{answer: func(r ctl.Request) ctl.Response {
		switch r.Op {
		case ctl.OpCopyInBegin:
			if r.Path != "work" {
				return ctl.Response{Error: "wrong dir " + r.Path}
			}
		case ctl.OpCopyInData:
			got.Write(r.Data)
		case ctl.OpCopyInEnd:
			return ctl.Response{Files: 7}
		}
		return ctl.Response{}
	}}
	call := g.serve(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), (2*ctl.MaxCopyChunk+100)/16)
	tr, err := copyIn(context.Background(), call, "work", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) || tr.SHA256 != digest(data) || tr.Bytes != int64(len(data)) || tr.Files != 7 {
		t.Fatalf("receipt %+v; the guest got %d of %d bytes", tr, got.Len(), len(data))
	}
	if n := g.saw(ctl.OpCopyInData); n != 3 {
		t.Fatalf("%d chunks for %d bytes, want 3", n, len(data))
	}
	if g.saw(ctl.OpCopyAbort) != 0 {
		t.Fatal("a copy that worked was aborted")
	}
}

// TestCopyRefusalsMapped: a guest's refusal keeps its class (an unsafe
// entry, a cap, an existing name, a missing path), and the host aborts
// the copy after it.
func TestCopyRefusalsMapped(t *testing.T) {
	for _, c := range []struct {
		resp ctl.Response
		want error
	}{
		{ctl.Response{Error: "x", Refused: ctl.RefusedUnsafe}, archive.ErrUnsafeEntry},
		{ctl.Response{Error: "x", Refused: ctl.RefusedTooLarge}, archive.ErrTooLarge},
		{ctl.Response{Error: "x", Refused: ctl.RefusedNotNew}, archive.ErrNotEmpty},
		{ctl.Response{Error: "x", ErrNo: "ENOENT"}, fs.ErrNotExist},
	} {
		g := &fakeGuest{answer: func(r ctl.Request) ctl.Response {
			if r.Op == ctl.OpCopyInEnd || r.Op == ctl.OpCopyOutData {
				return c.resp
			}
			return ctl.Response{}
		}}
		call := g.serve(t)
		_, err := copyIn(context.Background(), call, "", bytes.NewReader([]byte("tar")))
		if !errors.Is(err, c.want) {
			t.Errorf("copy in refused with %+v: %v, want %v", c.resp, err, c.want)
		}
		_, err = copyOut(context.Background(), call, "x", io.Discard, 1<<20)
		if !errors.Is(err, c.want) {
			t.Errorf("copy out refused with %+v: %v, want %v", c.resp, err, c.want)
		}
		if n := g.saw(ctl.OpCopyAbort); n != 2 {
			t.Errorf("refused with %+v: %d aborts, want 2", c.resp, n)
		}
	}
}

// TestCopyOutCutsOffALyingGuest: a guest that sends more than the
// host's cap is cut off at the cap (ErrTooLarge; the host wrote no byte
// past it and aborted the copy); positive control: with a cap above
// what the guest sends, the copy completes with the host's own receipt.
// A chunk over ctl.MaxCopyChunk, data with done and a negative count
// are protocol errors.
func TestCopyOutCutsOffALyingGuest(t *testing.T) {
	chunk := bytes.Repeat([]byte{'t'}, 64<<10)
	endless := func(limit int) func(ctl.Request) ctl.Response {
		sent := 0
		return func(r ctl.Request) ctl.Response {
			if r.Op != ctl.OpCopyOutData {
				return ctl.Response{}
			}
			if limit >= 0 && sent >= limit {
				return ctl.Response{Done: true, Files: 1}
			}
			sent++
			return ctl.Response{Data: chunk}
		}
	}
	const limit = int64(10 << 20)
	g := &fakeGuest{answer: endless(-1)}
	var w bytes.Buffer
	if _, err := copyOut(context.Background(), g.serve(t), "f", &w, limit); !errors.Is(err, archive.ErrTooLarge) {
		t.Fatalf("an endless guest: %v, want ErrTooLarge", err)
	}
	if int64(w.Len()) > limit || g.saw(ctl.OpCopyAbort) != 1 {
		t.Fatalf("took %d bytes over a cap of %d; %d aborts", w.Len(), limit, g.saw(ctl.OpCopyAbort))
	}

	g = &fakeGuest{answer: endless(int(limit)/len(chunk) - 1)}
	w.Reset()
	tr, err := copyOut(context.Background(), g.serve(t), "f", &w, limit)
	if err != nil || tr.SHA256 != digest(w.Bytes()) || tr.Bytes != limit-int64(len(chunk)) || tr.Files != 1 {
		t.Fatalf("a guest under the cap: %+v %v", tr, err)
	}

	for name, resp := range map[string]ctl.Response{
		"a chunk over the cap": {Data: make([]byte, ctl.MaxCopyChunk+1)},
		"data with done":       {Data: []byte("x"), Done: true},
		"negative files":       {Done: true, Files: -1},
		"an empty chunk":       {},
	} {
		g := &fakeGuest{answer: func(r ctl.Request) ctl.Response {
			if r.Op == ctl.OpCopyOutData {
				return resp
			}
			return ctl.Response{}
		}}
		var w bytes.Buffer
		if _, err := copyOut(context.Background(), g.serve(t), "f", &w, limit); !errors.Is(err, ctl.ErrProtocol) || w.Len() != 0 {
			t.Errorf("%s: %v (%d bytes taken), want ErrProtocol", name, err, w.Len())
		}
	}
}

// TestCopyInNegativeFiles: a guest's negative file count ends the copy
// in as a protocol error, and it is aborted.
func TestCopyInNegativeFiles(t *testing.T) {
	g := &fakeGuest{answer: func(r ctl.Request) ctl.Response {
		if r.Op == ctl.OpCopyInEnd {
			return ctl.Response{Files: -3}
		}
		return ctl.Response{}
	}}
	if _, err := copyIn(context.Background(), g.serve(t), "", bytes.NewReader([]byte("x"))); !errors.Is(err, ctl.ErrProtocol) || g.saw(ctl.OpCopyAbort) != 1 {
		t.Fatalf("%v, %d aborts; want ErrProtocol and an abort", err, g.saw(ctl.OpCopyAbort))
	}
}

// TestCopyStopsWhenCancelled: a copy whose context is cancelled (the
// caller went, the lease ended) sends no further chunk and aborts the
// guest's copy; the abort itself is not cancelled.
func TestCopyStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := &fakeGuest{answer: func(r ctl.Request) ctl.Response {
		switch r.Op {
		case ctl.OpCopyInData:
			cancel()
		case ctl.OpCopyOutData:
			cancel()
			return ctl.Response{Data: []byte("x")}
		}
		return ctl.Response{}
	}}
	call := g.serve(t)
	data := make([]byte, 3*ctl.MaxCopyChunk)
	if _, err := copyIn(ctx, call, "", bytes.NewReader(data)); !errors.Is(err, context.Canceled) {
		t.Fatalf("copy in: %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithCancel(context.Background()) // the guest's answer cancels this one now
	defer cancel()
	if _, err := copyOut(ctx, call, "f", io.Discard, 1<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("copy out: %v, want context.Canceled", err)
	}
	if in, out, ab := g.saw(ctl.OpCopyInData), g.saw(ctl.OpCopyOutData), g.saw(ctl.OpCopyAbort); in != 1 || out != 1 || ab != 2 {
		t.Fatalf("%d chunks in, %d out, %d aborts; want 1, 1, 2", in, out, ab)
	}
}
