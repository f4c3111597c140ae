package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/admission/backoff"
)

// DefaultPollInterval is how often a stream listener looks again for a
// peer while the device reports none (virtio-serial reads return end of
// file while the host side is not connected).
const DefaultPollInterval = 100 * time.Millisecond

// Stream is one byte stream: a character device opened as a file, such as
// a virtio-serial port (/dev/vportNpM in the guest) or a pty. It carries
// one connection at a time and has no peer authentication, so HostOnly
// must be set. A tty is switched to raw mode so every byte passes
// unchanged.
type Stream struct {
	// Path is the character device.
	Path string
	// HostOnly declares that only the host can reach the device. Required.
	HostOnly bool
	// PollInterval overrides DefaultPollInterval when positive.
	PollInterval time.Duration
	// Log receives device errors on Listen; nil discards.
	Log *slog.Logger
}

var _ Transport = Stream{}

func (s Stream) String() string { return "stream:" + s.Path }

func (s Stream) check() error {
	if err := requireHostOnly("byte stream", s.HostOnly); err != nil {
		return err
	}
	fi, err := os.Stat(s.Path)
	if err != nil {
		return fmt.Errorf("transport: stream device: %w", err)
	}
	if fi.Mode().Type() != fs.ModeDevice|fs.ModeCharDevice {
		return fmt.Errorf("%w: stream %s is not a character device (%v)", ErrConfig, s.Path, fi.Mode().Type())
	}
	return nil
}

// Dial opens the device; the returned file is the connection.
func (s Stream) Dial(ctx context.Context) (io.ReadWriteCloser, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return openStream(s.Path)
}

// Listen returns a listener whose Accept opens the device and returns once
// the peer has sent its first byte; it then waits for that connection to
// be closed before it opens the device again (a virtio-serial port admits
// one open at a time).
func (s Stream) Listen(ctx context.Context) (Listener, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	poll := s.PollInterval
	if poll <= 0 {
		poll = DefaultPollInterval
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &streamListener{path: s.Path, poll: poll, log: log, slot: make(chan struct{}, 1)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// openStream opens a character device read-write without making it the
// controlling terminal, in the runtime poller (so deadlines and Close
// interrupt reads), and puts a tty into raw mode.
func openStream(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("transport: open stream: %w", err)
	}
	if err := f.SetDeadline(time.Time{}); err != nil { // not in the poller: Close could not interrupt a read
		f.Close()
		return nil, fmt.Errorf("%w: stream %s cannot be polled: %w", ErrConfig, path, err)
	}
	if err := makeRaw(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("transport: stream %s: raw mode: %w", path, err)
	}
	return f, nil
}

// makeRaw applies cfmakeraw(3) to f if it is a tty; other devices are left
// as they are.
func makeRaw(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			return // not a tty
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR |
			unix.ICRNL | unix.IXON | unix.IXOFF
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB
		t.Cflag |= unix.CS8
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		serr = unix.IoctlSetTermios(int(fd), unix.TCSETS, t)
	})
	return errors.Join(cerr, serr)
}

type streamListener struct {
	path   string
	poll   time.Duration
	log    *slog.Logger
	slot   chan struct{} // holds a token while a connection is out
	ctx    context.Context
	cancel context.CancelFunc
}

func (l *streamListener) Addr() string { return "stream:" + l.path }

// Close makes pending and later Accepts return net.ErrClosed. A connection
// already returned stays open until its owner closes it.
func (l *streamListener) Close() error {
	l.cancel()
	return nil
}

// Accept waits for the previous connection to close, opens the device and
// waits for the peer's first byte.
func (l *streamListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.ctx, cancel)
	defer stop()
	select {
	case l.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, l.ctxErr(ctx)
	}
	for {
		f, err := openStream(l.path)
		if err == nil {
			var first byte
			if first, err = l.awaitFirstByte(ctx, f); err == nil {
				return &streamConn{f: f, first: []byte{first}, release: func() { <-l.slot }}, nil
			}
			f.Close()
		}
		if ctx.Err() != nil {
			<-l.slot
			return nil, l.ctxErr(ctx)
		}
		l.log.Warn("transport: stream device not ready; retrying", "path", l.path, "err", err)
		if backoff.Sleep(ctx, l.poll) != nil {
			<-l.slot
			return nil, l.ctxErr(ctx)
		}
	}
}

func (l *streamListener) ctxErr(ctx context.Context) error {
	if l.ctx.Err() != nil {
		return net.ErrClosed
	}
	return ctx.Err()
}

// awaitFirstByte blocks until the peer sends a byte. End of file means no
// peer is connected yet: it polls again after the interval.
func (l *streamListener) awaitFirstByte(ctx context.Context, f *os.File) (byte, error) {
	var b [1]byte
	for {
		var n int
		err := withCtx(ctx, f, func() (err error) {
			n, err = f.Read(b[:])
			return err
		})
		switch {
		case n == 1:
			return b[0], nil
		case err != nil && !errors.Is(err, io.EOF):
			return 0, err
		}
		if backoff.Sleep(ctx, l.poll) != nil {
			return 0, ctx.Err()
		}
	}
}

// streamConn is an accepted stream: the first byte, then the device.
type streamConn struct {
	f       *os.File
	first   []byte
	release func()
	once    sync.Once
}

func (c *streamConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 && len(p) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.f.Read(p)
}

func (c *streamConn) Write(p []byte) (int, error) { return c.f.Write(p) }

// SetWriteDeadline bounds writes (a peer that stops reading).
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// Close closes the device and lets the listener open it again.
func (c *streamConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.f.Close()
		c.release()
	})
	return err
}
