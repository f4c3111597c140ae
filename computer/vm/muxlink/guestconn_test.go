package muxlink

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// linkOverSocket starts a host and a guest (GuestConn or Guest) over a
// socket pair, opens one stream and returns both ends of it with the
// host's socket.
func linkOverSocket(t *testing.T, start func(io.ReadWriter) *Link) (hostSock net.Conn, guest *Link, hs, gs *Stream) {
	t.Helper()
	h, g := socketPair(t)
	guest = start(g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, err := Host(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if hs, err = host.Open(); err != nil {
		t.Fatal(err)
	}
	if _, err := hs.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if gs, err = guest.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(gs, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("stream over the socket: %q %v", buf, err)
	}
	if _, err := gs.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(hs, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("stream back over the socket: %q %v", buf, err)
	}
	return h, guest, hs, gs
}

// TestGuestConnEndsAtEOF: over a connected socket (the vsock link) the
// link carries streams both ways, and the host closing its socket ends
// the guest's link (a socket has no next host). Positive control: the
// port flavour (Guest) over the same socket keeps its link at the same
// end-of-file, only its streams reset, as a virtio-serial port needs.
func TestGuestConnEndsAtEOF(t *testing.T) {
	h, guest, _, gs := linkOverSocket(t, GuestConn)
	h.Close()
	select {
	case <-guest.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the guest's link did not end when the host closed the socket")
	}
	if !errors.Is(guest.Err(), ErrClosed) {
		t.Fatalf("Err = %v, want ErrClosed", guest.Err())
	}
	if _, err := gs.Read(make([]byte, 1)); err == nil {
		t.Fatal("a stream of an ended link still reads")
	}

	h, guest, _, gs = linkOverSocket(t, Guest)
	h.Close()
	if _, err := io.ReadAll(gs); err == nil {
		t.Log("the stream ended with end-of-file")
	}
	if err := guest.Err(); err != nil {
		t.Fatalf("control: the port flavour ended its link at end-of-file: %v", err)
	}
}
