package muxlink

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Conn is a Stream as a net.Conn, for a server that reads with deadlines
// and must be able to drop a connection at once (the egress proxy
// serving a guest's dialed streams). Its Close and a Write it cuts short
// never wait for the link: a guest that is stopped (QMP stop) reads
// nothing, and a frame to it would wait until it runs again or the link
// ends. Close must be called; it is safe to call twice.
type Conn struct {
	s    *Stream
	addr Addr

	wmu       sync.Mutex // one Write at a time, in order
	closed    chan struct{}
	closeOnce sync.Once

	mu            sync.Mutex
	writeDeadline time.Time
	broken        error // a Write was cut short: the stream's bytes are no longer whole
}

var _ net.Conn = (*Conn)(nil)

// Addr names one stream of a link; both ends of a Conn carry it.
type Addr struct{ Stream uint32 }

// Network implements net.Addr.
func (Addr) Network() string { return "muxlink" }

// String implements net.Addr.
func (a Addr) String() string { return fmt.Sprintf("stream-%#x", a.Stream) }

// NewConn makes s a net.Conn; the Conn owns s.
func NewConn(s *Stream) *Conn {
	return &Conn{s: s, addr: Addr{Stream: s.id}, closed: make(chan struct{})}
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) { return c.s.Read(p) }

// Write implements net.Conn. It hands a copy of p to the link and
// returns when the link took it, or as soon as the Conn is closed or its
// write deadline passes; the Conn is then broken for later writes.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	dl, broken := c.writeDeadline, c.broken
	c.mu.Unlock()
	if broken != nil {
		return 0, broken
	}
	buf := append([]byte(nil), p...)
	done := make(chan error, 1)
	go func() { _, err := c.s.Write(buf); done <- err }()
	var expired <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		expired = t.C
	}
	select {
	case err := <-done:
		if err != nil {
			return 0, err
		}
		return len(p), nil
	case <-c.closed:
		return 0, c.breakWrites(net.ErrClosed)
	case <-expired:
		return 0, c.breakWrites(os.ErrDeadlineExceeded)
	}
}

func (c *Conn) breakWrites(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = err
	}
	return err
}

// Close implements net.Conn: the stream ends here at once (a blocked
// Read or Write returns); the peer is told by a goroutine that may wait
// for the link.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.s.closeNoWait()
	})
	return nil
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.addr }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.addr }

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetWriteDeadline(t)
	return c.s.SetReadDeadline(t)
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.s.SetReadDeadline(t) }

// SetWriteDeadline implements net.Conn; it bounds Writes begun after it.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeDeadline = t
	return nil
}
