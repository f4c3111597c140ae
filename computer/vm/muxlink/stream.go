package muxlink

import (
	"errors"
	"io"
	"sync"
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	reset := s.err != nil && !errors.Is(s.err, ErrClosed)
	if s.err == nil {
		s.err = ErrClosed
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.l.forget(s.id)
	if reset {
		return nil
	}
	return s.l.writeFrame(frame{typ: typeClose, stream: s.id})
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
