package muxlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// pair links a host and a guest over a socket pair; before the host
// starts, stale is already in the guest's input.
func pair(t *testing.T, stale []byte) (*Link, *Link) {
	t.Helper()
	h, g := net.Pipe()
	t.Cleanup(func() { h.Close(); g.Close() })
	guest := Guest(g)
	if len(stale) > 0 {
		if _, err := h.Write(stale); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, err := Host(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	return host, guest
}

// echo serves every stream the guest accepts by echoing it.
func echo(g *Link) {
	for {
		s, err := g.Accept(context.Background())
		if err != nil {
			return
		}
		go func() { _, _ = io.Copy(s, s); s.Close() }()
	}
}

// TestStreamsAreIndependent: concurrent streams each get their own bytes
// back, larger than one frame.
func TestStreamsAreIndependent(t *testing.T) {
	host, guest := pair(t, nil)
	go echo(guest)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := host.Open()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			msg := bytes.Repeat([]byte(fmt.Sprintf("stream %d;", i)), 10_000)
			go func() { _, _ = s.Write(msg) }()
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
				errs <- fmt.Errorf("stream %d: %v (equal %v)", i, err, bytes.Equal(got, msg))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStaleBytesNeverReachAStream: garbage and a half frame left in the
// port from an earlier host are skipped; the positive control shows the
// same bytes are a stream's data when the hello's realignment is not
// awaited.
func TestStaleBytesNeverReachAStream(t *testing.T) {
	stale := appendFrame(nil, frame{typ: typeData, stream: 1, payload: []byte("INJECTED")})
	stale = append([]byte{0xff, 0x00, 0x13}, stale[:len(stale)-3]...)
	host, guest := pair(t, stale)
	got := make(chan []byte, 1)
	go func() {
		s, err := guest.Accept(context.Background())
		if err != nil {
			return
		}
		b := make([]byte, 64)
		n, _ := s.Read(b)
		got <- b[:n]
	}()
	s, err := host.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("real")); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "real" {
		t.Fatalf("the guest's first stream read %q, want only the host's bytes", b)
	}

	// positive control: a data frame for an open stream is delivered
	h2, g2 := net.Pipe()
	defer h2.Close()
	defer g2.Close()
	gl := Guest(g2)
	go func() {
		_, _ = h2.Write(appendFrame(nil, frame{typ: typeOpen, stream: 1}))
		_, _ = h2.Write(appendFrame(nil, frame{typ: typeData, stream: 1, payload: []byte("INJECTED")}))
		_, _ = io.Copy(io.Discard, h2)
	}()
	gs, err := gl.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	n, _ := gs.Read(b)
	if string(b[:n]) != "INJECTED" {
		t.Fatalf("control: read %q", b[:n])
	}
}

// TestOverrunClosesTheStream: a reader that does not read loses its
// stream past MaxBuffered, and the link keeps working.
func TestOverrunClosesTheStream(t *testing.T) {
	host, guest := pair(t, nil)
	accepted := make(chan *Stream, 2)
	go func() {
		for {
			s, err := guest.Accept(context.Background())
			if err != nil {
				return
			}
			accepted <- s
		}
	}()
	s, err := host.Open()
	if err != nil {
		t.Fatal(err)
	}
	lazy := <-accepted
	chunk := make([]byte, MaxPayload)
	for i := 0; i <= MaxBuffered/MaxPayload+1; i++ {
		if _, err := s.Write(chunk); err != nil {
			break
		}
	}
	if _, err := io.ReadAll(lazy); !errors.Is(err, ErrOverrun) {
		t.Fatalf("lazy reader: %v, want ErrOverrun", err)
	}
	s2, err := host.Open()
	if err != nil {
		t.Fatal(err)
	}
	fresh := <-accepted
	go func() { _, _ = s2.Write([]byte("ok")) }()
	b := make([]byte, 2)
	if _, err := io.ReadFull(fresh, b); err != nil || string(b) != "ok" {
		t.Fatalf("after the overrun: %q %v", b, err)
	}
}

// FuzzParseHeader: any 9 bytes are either refused or a frame whose
// encoding is those bytes.
func FuzzParseHeader(f *testing.F) {
	f.Add(appendFrame(nil, frame{typ: typeData, stream: 3, payload: []byte("x")})[:headerLen])
	f.Add(appendFrame(nil, frame{typ: typeHello, payload: make([]byte, nonceLen)})[:headerLen])
	f.Add(appendFrame(nil, frame{typ: typeDial, stream: GuestStreamBit | 1})[:headerLen])
	f.Fuzz(func(t *testing.T, h []byte) {
		fr, n, err := parseHeader(h)
		if err != nil {
			return
		}
		if n > MaxPayload {
			t.Fatalf("length %d accepted", n)
		}
		if (fr.typ == typeOpen && fr.stream&GuestStreamBit != 0) || (fr.typ == typeDial && fr.stream&GuestStreamBit == 0) {
			t.Fatalf("type %#x of stream %#x accepted", fr.typ, fr.stream)
		}
		fr.payload = make([]byte, n)
		if enc := appendFrame(nil, fr)[:headerLen]; !bytes.Equal(enc, h) {
			t.Fatalf("re-encoded %x, parsed from %x", enc, h)
		}
	})
}
