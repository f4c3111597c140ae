package muxlink

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// Stream is one connection over a Link. Close must be called; it is safe
// to call twice.
type Stream struct {
	l  *Link
	id uint32

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	eof    bool  // the peer closed
	err    error // set when the stream is closed here or reset
	closed bool  // Close ran

	readDeadline time.Time   // zero: none
	readTimer    *time.Timer // wakes Read at readDeadline
}

var _ io.ReadWriteCloser = (*Stream)(nil)

func newStream(l *Link, id uint32) *Stream {
	s := &Stream{l: l, id: id}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Read reads what the peer sent; io.EOF once the peer closed and every
// byte was read.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) == 0 && !s.eof && s.err == nil {
		if !s.readDeadline.IsZero() && !time.Now().Before(s.readDeadline) {
			return 0, os.ErrDeadlineExceeded
		}
		s.cond.Wait()
	}
	switch {
	case len(s.buf) > 0:
		n := copy(p, s.buf)
		s.buf = s.buf[n:]
		return n, nil
	case s.err != nil:
		return 0, s.err
	}
	return 0, io.EOF
}

// Write sends p in frames of at most MaxPayload bytes.
func (s *Stream) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if err := s.writable(); err != nil {
			return written, err
		}
		n := min(len(p), MaxPayload)
		if err := s.l.writeFrame(frame{typ: typeData, stream: s.id, payload: p[:n]}); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

func (s *Stream) writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != nil:
		return s.err
	case s.eof:
		return ErrClosed
	}
	return nil
}

// Close tells the peer the stream ended and wakes a blocked Read.
func (s *Stream) Close() error {
	if !s.shut() {
		return nil
	}
	return s.tellClosed()
}

// shut ends the stream here: a blocked Read wakes, later reads and
// writes fail. It says whether the peer is still to be told
// (tellClosed): not after a reset or a Close before.
func (s *Stream) shut() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	reset := s.err != nil && !errors.Is(s.err, ErrClosed)
	if s.err == nil {
		s.err = ErrClosed
	}
	if s.readTimer != nil {
		s.readTimer.Stop()
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.l.forget(s.id)
	return !reset
}

// closeNoWait is Close for a caller that must not wait for the link (a
// stopped guest reads nothing): the peer is told by a goroutine.
func (s *Stream) closeNoWait() {
	if s.shut() {
		go func() { _ = s.tellClosed() }()
	}
}

// tellClosed sends the peer the close frame; it waits for the link's
// writer like any frame.
func (s *Stream) tellClosed() error {
	return s.l.writeFrame(frame{typ: typeClose, stream: s.id})
}

// SetReadDeadline makes a Read blocked at t, or begun after it, return
// os.ErrDeadlineExceeded; the zero time means no deadline.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readDeadline = t
	if s.readTimer != nil {
		s.readTimer.Stop()
		s.readTimer = nil
	}
	if !t.IsZero() {
		s.readTimer = time.AfterFunc(time.Until(t), func() {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		})
	}
	s.cond.Broadcast()
	return nil
}

// deliver queues bytes from the peer; past MaxBuffered the stream is
// closed (ErrOverrun).
func (s *Stream) deliver(p []byte) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if len(s.buf)+len(p) > MaxBuffered {
		s.err = ErrOverrun
		s.cond.Broadcast()
		s.mu.Unlock()
		_ = s.l.writeFrame(frame{typ: typeClose, stream: s.id})
		s.l.forget(s.id)
		return
	}
	s.buf = append(s.buf, p...)
	s.cond.Broadcast()
	s.mu.Unlock()
}

func (s *Stream) remoteClosed() {
	s.mu.Lock()
	s.eof = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.l.forget(s.id)
}

// fail ends the stream with err without telling the peer (the link is
// gone or realigned).
func (s *Stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.cond.Broadcast()
}
