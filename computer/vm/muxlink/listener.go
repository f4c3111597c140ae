package muxlink

import (
	"context"
	"errors"
	"net"
	"sync"
)

// ErrListening: the link has a Listener already.
var ErrListening = errors.New("muxlink: the link has a listener already")

// Listener is the host's net.Listener of the streams the guest dials:
// Accept yields each as a *Conn. Close must be called (safe twice); it
// makes the link refuse the guest's dials again, and leaves the
// connections accepted so far to their holders.
type Listener struct {
	l         *Link
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Listen starts taking the guest's dials (host only; one Listener at a
// time).
func (l *Link) Listen() (*Listener, error) {
	if !l.host {
		return nil, errors.New("muxlink: only the host listens")
	}
	l.mu.Lock()
	if l.dialable {
		l.mu.Unlock()
		return nil, ErrListening
	}
	l.dialable = true
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	return &Listener{l: l, ctx: ctx, cancel: cancel}, nil
}

// Accept implements net.Listener: the next stream the guest dialed.
// After Close, or once the link ended, it fails with net.ErrClosed.
func (ln *Listener) Accept() (net.Conn, error) {
	s, err := ln.l.Accept(ln.ctx)
	if err != nil {
		return nil, errors.Join(net.ErrClosed, err)
	}
	if ln.ctx.Err() != nil { // closed while the stream waited
		s.closeNoWait()
		return nil, net.ErrClosed
	}
	return NewConn(s), nil
}

// Close implements net.Listener.
func (ln *Listener) Close() error {
	ln.closeOnce.Do(func() {
		ln.cancel()
		ln.l.SetDialable(false)
	})
	return nil
}

// Addr implements net.Listener.
func (ln *Listener) Addr() net.Addr { return Addr{} }
