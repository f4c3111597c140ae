package muxlink

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Errors callers branch on.
var (
	// ErrClosed: the link or the stream is closed.
	ErrClosed = errors.New("muxlink: closed")
	// ErrOverrun: a stream's reader fell more than MaxBuffered behind.
	ErrOverrun = errors.New("muxlink: stream buffer overrun")
)

// helloEvery is how often the host repeats its hello until the guest
// echoes it (the guest may still be booting, or skipping stale bytes).
const helloEvery = 500 * time.Millisecond

// eofPause is how long the guest waits after its port read end-of-file
// (no host connected) before it reads again.
const eofPause = 100 * time.Millisecond

// Link is one end of a link. Its methods are safe for concurrent use.
type Link struct {
	rw    io.ReadWriter
	r     *bufio.Reader
	host  bool
	nonce [nonceLen]byte

	wmu sync.Mutex // one frame at a time on rw

	mu      sync.Mutex
	streams map[uint32]*Stream
	next    uint32
	err     error         // set once the link ended
	done    chan struct{} // closed when the read loop ended
	ready   chan struct{} // host: closed when the guest echoed the hello
	accept  chan *Stream  // guest: streams the host opened; host: streams the guest dialed

	eofEnds   bool   // guest over a socket (GuestConn): end-of-file ends the link
	dialable  bool   // host: guest dials are accepted (SetDialable)
	guestOpen int    // streams with GuestStreamBit in streams
	nextDial  uint32 // guest: the last id dialed, without GuestStreamBit
}

// Host starts the host's end on rw (QEMU's chardev socket) and returns
// once the guest has echoed its hello, so the link holds no stale bytes.
// The caller closes rw, which ends the link; Done says when it ended.
func Host(ctx context.Context, rw io.ReadWriter) (*Link, error) {
	l := newLink(rw, true)
	if _, err := rand.Read(l.nonce[:]); err != nil {
		return nil, err
	}
	go l.readLoop()
	t := time.NewTicker(helloEvery)
	defer t.Stop()
	for {
		if err := l.writeFrame(frame{typ: typeHello, payload: l.nonce[:]}); err != nil {
			return nil, err
		}
		select {
		case <-l.ready:
			return l, nil
		case <-l.done:
			return nil, fmt.Errorf("muxlink: before the guest's hello: %w", l.Err())
		case <-ctx.Done():
			return nil, fmt.Errorf("muxlink: the guest did not echo the hello: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Guest starts the guest's end on rw (its virtio-serial port). The link
// lives until rw fails otherwise than with end-of-file, which the port
// reads while no host is connected.
func Guest(rw io.ReadWriter) *Link {
	l := newLink(rw, false)
	go l.readLoop()
	return l
}

// GuestConn starts the guest's end on a connected socket (the vsock
// connection the guest dialed to the host): unlike a port, a socket that
// reads end-of-file has no next host, so end-of-file ends the link.
func GuestConn(rw io.ReadWriter) *Link {
	l := newLink(rw, false)
	l.eofEnds = true
	go l.readLoop()
	return l
}

func newLink(rw io.ReadWriter, host bool) *Link {
	return &Link{rw: rw, r: bufio.NewReaderSize(rw, 64<<10), host: host, streams: map[uint32]*Stream{},
		done: make(chan struct{}), ready: make(chan struct{}), accept: make(chan *Stream, 16)}
}

// Done is closed when the link has ended; Err then says why.
func (l *Link) Done() <-chan struct{} { return l.done }

// Err is why the link ended, nil while it runs.
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Open opens a new stream (host only). The caller closes it.
func (l *Link) Open() (*Stream, error) {
	if !l.host {
		return nil, errors.New("muxlink: only the host opens streams")
	}
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.err
	}
	l.next = l.next%(GuestStreamBit-1) + 1 // never GuestStreamBit's space, never 0
	for l.streams[l.next] != nil {
		l.next = l.next%(GuestStreamBit-1) + 1
	}
	s := newStream(l, l.next)
	l.streams[s.id] = s
	l.mu.Unlock()
	if err := l.writeFrame(frame{typ: typeOpen, stream: s.id}); err != nil {
		s.fail(err)
		return nil, err
	}
	return s, nil
}

// Accept returns the next stream the host opened (on the guest), or the
// next stream the guest dialed while SetDialable was on (on the host).
// The caller closes it.
func (l *Link) Accept(ctx context.Context) (*Stream, error) {
	select {
	case s := <-l.accept:
		return s, nil
	case <-l.done:
		return nil, l.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Link) writeFrame(f frame) error {
	b := appendFrame(make([]byte, 0, headerLen+len(f.payload)), f)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.rw.Write(b)
	return err
}

// readLoop dispatches frames until the link fails.
func (l *Link) readLoop() {
	var err error
	for err == nil {
		err = l.readOne()
	}
	l.mu.Lock()
	l.err = fmt.Errorf("%w: %w", ErrClosed, err)
	l.mu.Unlock()
	l.resetAll(ErrClosed)
	close(l.done)
}

// readOne reads and handles one frame. A malformed header drops one
// byte and every stream (the sender's frames are no longer aligned);
// the next hello realigns the link.
func (l *Link) readOne() error {
	h, err := l.r.Peek(headerLen)
	if err != nil {
		return l.atEOF(err)
	}
	f, n, err := parseHeader(h)
	if err != nil {
		l.resetAll(err)
		_, _ = l.r.Discard(1)
		return nil
	}
	if _, err := l.r.Discard(headerLen); err != nil {
		return err
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(l.r, f.payload); err != nil {
		return l.atEOF(err)
	}
	l.handle(f)
	return nil
}

// atEOF: the guest's port reads end-of-file while no host is connected;
// it drops the streams and waits for the next host. Any other error, and
// any error on the host, ends the link.
func (l *Link) atEOF(err error) error {
	if l.host || l.eofEnds || !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	l.resetAll(ErrClosed)
	time.Sleep(eofPause)
	return nil
}

func (l *Link) handle(f frame) {
	switch {
	case f.typ == typeHello && l.host:
		if bytes.Equal(f.payload, l.nonce[:]) {
			l.markReady()
		}
	case f.typ == typeHello:
		l.resetAll(ErrClosed)
		_ = l.writeFrame(f)
	case l.host && !l.isReady():
		// bytes of an earlier link: dropped until the echo
	case f.typ == typeOpen && !l.host:
		l.opened(f.stream)
	case f.typ == typeDial && l.host:
		l.dialed(f.stream)
	case f.typ == typeData:
		if s := l.stream(f.stream); s != nil {
			s.deliver(f.payload)
		}
	case f.typ == typeClose:
		if s := l.stream(f.stream); s != nil {
			s.remoteClosed()
		}
	}
}

func (l *Link) markReady() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.ready:
	default:
		close(l.ready)
	}
}

func (l *Link) isReady() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// opened registers a stream the host opened and offers it to Accept; a
// stream nobody accepts in time is closed.
func (l *Link) opened(id uint32) {
	l.mu.Lock()
	if _, dup := l.streams[id]; dup {
		l.mu.Unlock()
		return
	}
	s := newStream(l, id)
	l.streams[id] = s
	l.mu.Unlock()
	select {
	case l.accept <- s:
	default:
		s.Close()
	}
}

func (l *Link) stream(id uint32) *Stream {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams[id]
}

func (l *Link) forget(id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.streams[id]; ok && id&GuestStreamBit != 0 {
		l.guestOpen--
	}
	delete(l.streams, id)
}

// resetAll ends every stream with err, without telling the peer.
func (l *Link) resetAll(err error) {
	l.mu.Lock()
	all := l.streams
	l.streams = map[uint32]*Stream{}
	l.guestOpen = 0
	l.mu.Unlock()
	for _, s := range all {
		s.fail(err)
	}
}
