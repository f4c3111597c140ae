package muxlink

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestGuestDialReachesTheHostListener: a stream the guest dials while
// the host listens is accepted there as a net.Conn and carries bytes both
// ways; the same dial before Listen and after Close ends at once (the
// positive control of the refusal is the accepted dial).
func TestGuestDialReachesTheHostListener(t *testing.T) {
	host, guest := pair(t, nil)
	if _, err := host.Dial(); err == nil {
		t.Fatal("the host dialed")
	}
	if _, err := guest.Listen(); err == nil {
		t.Fatal("the guest listened")
	}
	requireRefused(t, guest)
	ln, err := host.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Listen(); !errors.Is(err, ErrListening) {
		t.Fatalf("a second Listen: %v, want ErrListening", err)
	}
	s, err := guest.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(c, c); c.Close() }()
	want := bytes.Repeat([]byte("egress "), 3*MaxPayload/7)
	go s.Write(want)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("echo through the host: %d bytes, %v", len(got), err)
	}
	ln.Close()
	ln.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	requireRefused(t, guest)
}

// requireRefused dials from the guest and wants the stream to end with
// no byte.
func requireRefused(t *testing.T, guest *Link) {
	t.Helper()
	s, err := guest.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := s.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("a dial the host does not take read %d bytes, %v; want EOF", n, err)
	}
}

// rawGuest plays a hostile guest on the host's link: it echoes the
// hello and then writes whatever frames the test gives it. The two ends
// are a unix socket pair, buffered as QEMU's chardev socket is: the
// host's hellos and frames wait there until the test reads them.
func rawGuest(t *testing.T) (*Link, net.Conn) {
	t.Helper()
	h, g := socketPair(t)
	type res struct {
		l   *Link
		err error
	}
	done := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := Host(ctx, h)
		done <- res{l, err}
	}()
	f, err := readFrame(g)
	if err != nil || f.typ != typeHello {
		t.Fatalf("first frame %+v, %v", f, err)
	}
	if _, err := g.Write(appendFrame(nil, f)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.l, g
}

// TestHostBoundsTheGuestsDials: a guest that ignores its own bound and
// dials MaxGuestStreams+1 streams gets the last one closed at once, and
// one more once a stream ended; an open (the host's frame) from the
// guest opens nothing.
func TestHostBoundsTheGuestsDials(t *testing.T) {
	host, g := rawGuest(t)
	ln, err := host.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	frames := make(chan frame, 4*MaxGuestStreams)
	go func() {
		for {
			f, err := readFrame(g)
			if err != nil {
				close(frames)
				return
			}
			frames <- f
		}
	}()
	write := func(f frame) {
		t.Helper()
		if _, err := g.Write(appendFrame(nil, f)); err != nil {
			t.Fatal(err)
		}
	}
	var conns []net.Conn
	for i := uint32(1); i <= MaxGuestStreams; i++ {
		write(frame{typ: typeDial, stream: GuestStreamBit | i})
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	over := GuestStreamBit | (MaxGuestStreams + 1)
	write(frame{typ: typeDial, stream: over})
	wantClose(t, frames, over)
	conns[0].Close()
	wantClose(t, frames, GuestStreamBit|1)
	write(frame{typ: typeDial, stream: over})
	if c, err := ln.Accept(); err != nil || c.LocalAddr().(Addr).Stream != over {
		t.Fatalf("after one ended, the next dial: %v, %v", c, err)
	}
	// An open from the guest: the host's kind of frame, never taken.
	write(frame{typ: typeOpen, stream: 7})
	write(frame{typ: typeData, stream: 7, payload: []byte("x")})
	if host.stream(7) != nil {
		t.Fatal("the host registered a stream the guest opened")
	}
}

func wantClose(t *testing.T, frames <-chan frame, id uint32) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatal("link ended")
			}
			if f.typ == typeClose && f.stream == id {
				return
			}
		case <-timeout:
			t.Fatalf("no close of stream %#x", id)
		}
	}
}

// TestDialFramesAreStrict: a dial must name a guest's id and carry no
// payload; an open must name a host's id.
func TestDialFramesAreStrict(t *testing.T) {
	for name, f := range map[string]frame{
		"dial of a host's id":  {typ: typeDial, stream: 5},
		"dial with a payload":  {typ: typeDial, stream: GuestStreamBit | 1, payload: []byte("x")},
		"open of a guest's id": {typ: typeOpen, stream: GuestStreamBit | 1},
		"dial of stream 0":     {typ: typeDial},
	} {
		if _, _, err := parseHeader(appendFrame(nil, f)[:headerLen]); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
	if _, _, err := parseHeader(appendFrame(nil, frame{typ: typeDial, stream: GuestStreamBit | 1})[:headerLen]); err != nil {
		t.Errorf("a well-formed dial: %v", err)
	}
}

// TestConnCloseNeverWaitsForTheLink: a Write to a guest that reads
// nothing (a stopped VM; the socket's buffer fills) returns once the
// Conn is closed, a read
// deadline ends a blocked Read, and the listener's Close returns with a
// dial still waiting for Accept.
func TestConnCloseNeverWaitsForTheLink(t *testing.T) {
	host, g := rawGuest(t)
	ln, err := host.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := g.Write(appendFrame(nil, frame{typ: typeDial, stream: GuestStreamBit | 1})); err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	wrote := make(chan error, 1)
	big := make([]byte, 4*MaxBuffered) // more than the socket pair buffers
	go func() { _, err := c.Write(big); wrote <- err }()
	select {
	case err := <-wrote:
		t.Fatalf("a write to a guest that reads nothing returned %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the link")
	}
	select {
	case err := <-wrote:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("the cut write: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the blocked write")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("a write after Close")
	}
	// A dial that waits for Accept when the listener closes: the close
	// does not wait for the guest either.
	if _, err := g.Write(appendFrame(nil, frame{typ: typeDial, stream: GuestStreamBit | 2})); err != nil {
		t.Fatal(err)
	}
	for len(host.accept) == 0 {
		time.Sleep(time.Millisecond)
	}
	lnClosed := make(chan struct{})
	go func() { ln.Close(); close(lnClosed) }()
	select {
	case <-lnClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("the listener's Close waited for the link")
	}
}

// FuzzHostLinkFromGuest: whatever bytes a hostile guest sends after the
// hello, the host's count of the guest's streams matches the streams it
// holds and never passes MaxGuestStreams, and a host's stream is never
// registered from the guest's side.
func FuzzHostLinkFromGuest(f *testing.F) {
	var seed []byte
	for i := uint32(1); i <= MaxGuestStreams+2; i++ {
		seed = appendFrame(seed, frame{typ: typeDial, stream: GuestStreamBit | i})
		seed = appendFrame(seed, frame{typ: typeData, stream: GuestStreamBit | i, payload: []byte("x")})
	}
	seed = appendFrame(seed, frame{typ: typeClose, stream: GuestStreamBit | 1})
	seed = appendFrame(seed, frame{typ: typeOpen, stream: 9})
	f.Add(seed)
	f.Add([]byte{typeDial, 0x80, 0, 0, 1, 0, 0, 0, 0, typeDial, 0x80, 0, 0, 1, 0, 0, 0, 0, typeClose})
	f.Fuzz(func(t *testing.T, b []byte) {
		host, g := rawGuest(t)
		ln, err := host.Listen()
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for i := 0; ; i++ {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if i%2 == 0 {
					c.Close()
				}
			}
		}()
		go func() { _, _ = io.Copy(io.Discard, g) }()
		if _, err := g.Write(b); err != nil {
			t.Fatal(err)
		}
		host.mu.Lock()
		defer host.mu.Unlock()
		n := 0
		for id := range host.streams {
			if id&GuestStreamBit == 0 {
				t.Fatalf("a host's stream %#x registered from the guest's bytes", id)
			}
			n++
		}
		if n != host.guestOpen || n > MaxGuestStreams {
			t.Fatalf("%d guest streams held, counted %d (max %d)", n, host.guestOpen, MaxGuestStreams)
		}
	})
}
