package muxlink

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/receiver/conformance"
	"github.com/tetherdev/tether/receiver/wireserver"
)

// TestConformance runs the receiver transport suite over a link: the
// wire server accepts the guest's streams, the client opens the host's,
// as the VM tier's relay and guest agent do (over a unix socket pair
// standing in for the virtio-serial port).
func TestConformance(t *testing.T) { conformance.Run(t, linkSetup) }

func linkSetup(t testing.TB) (wireserver.Listener, conformance.Dial) {
	h, g := socketPair(t)
	guest := Guest(g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, err := Host(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	l := &streamListener{link: guest, closed: make(chan struct{})}
	return l, func(context.Context) (io.ReadWriteCloser, error) { return host.Open() }
}

// socketPair returns both ends of a unix stream socket pair, closed at
// cleanup.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("unix", dir+"/port.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("unix", dir+"/port.sock")
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// streamListener is the guest's end as a wire server's listener.
type streamListener struct {
	link   *Link
	once   sync.Once
	closed chan struct{}
}

func (l *streamListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	s, err := l.link.Accept(ctx)
	if err != nil {
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		default:
		}
	}
	return s, err
}

func (l *streamListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}
