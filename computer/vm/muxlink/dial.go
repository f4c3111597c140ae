package muxlink

import (
	"errors"
	"fmt"
)

// Streams the guest dials: the VM tier's egress (computer/vm/egress.go).
// A program in the guest connects to a listener on the guest's loopback;
// the guest's agent dials a stream for the connection, and the host hands
// the stream to the egress proxy, which trusts nothing the stream says:
// the link it came over names the computer. The host takes dials only
// while it says so (SetDialable) and holds at most MaxGuestStreams of
// them open at once; any other dial is answered with a close at once.

// MaxGuestStreams bounds the streams the guest has dialed that are open
// at once. With MaxBuffered per stream it bounds what a guest's streams
// hold in the host's memory (128 MiB).
const MaxGuestStreams = 32

// ErrNotDialable: the host does not take the guest's dials now (the
// guest's Dial returns it when it is over its bound; the host's refusal
// reaches the guest as a stream that ends at once).
var ErrNotDialable = errors.New("muxlink: the host takes no dial")

// Dial opens a stream to the host (guest only). When the host does not
// take it, the stream reads end-of-file at once. The caller closes it.
func (l *Link) Dial() (*Stream, error) {
	if l.host {
		return nil, errors.New("muxlink: only the guest dials")
	}
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.err
	}
	if l.guestOpen >= MaxGuestStreams {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %d streams open", ErrNotDialable, MaxGuestStreams)
	}
	id := l.nextDialID()
	s := newStream(l, id)
	l.streams[id] = s
	l.guestOpen++
	l.mu.Unlock()
	if err := l.writeFrame(frame{typ: typeDial, stream: id}); err != nil {
		s.fail(err)
		l.forget(id)
		return nil, err
	}
	return s, nil
}

// nextDialID is a guest's id not in use: GuestStreamBit and 1..2^31-1.
// The caller holds l.mu (fewer than MaxGuestStreams are in use).
func (l *Link) nextDialID() uint32 {
	for {
		l.nextDial = l.nextDial%(GuestStreamBit-1) + 1
		if id := GuestStreamBit | l.nextDial; l.streams[id] == nil {
			return id
		}
	}
}

// SetDialable says whether the host takes the guest's dials (host
// only; off by default). Turning it off closes the dialed streams that
// wait for Accept; streams already accepted stay with their holders.
func (l *Link) SetDialable(on bool) {
	if !l.host {
		return
	}
	var waiting []*Stream
	l.mu.Lock()
	l.dialable = on
	for !on && len(l.accept) > 0 {
		waiting = append(waiting, <-l.accept)
	}
	l.mu.Unlock()
	for _, s := range waiting {
		s.closeNoWait()
	}
}

// dialed registers a stream the guest dialed and offers it to Accept.
// A dial while the host takes none, past MaxGuestStreams, or with no
// room to wait for Accept is answered with a close; a dial of an id in
// use is dropped (the guest's own bug; the stream it names is left be).
func (l *Link) dialed(id uint32) {
	l.mu.Lock()
	if _, dup := l.streams[id]; dup {
		l.mu.Unlock()
		return
	}
	if !l.dialable || l.guestOpen >= MaxGuestStreams {
		l.mu.Unlock()
		_ = l.writeFrame(frame{typ: typeClose, stream: id})
		return
	}
	s := newStream(l, id)
	l.streams[id] = s
	l.guestOpen++
	queued := false
	select { // under l.mu, so SetDialable(false) drains what was queued
	case l.accept <- s:
		queued = true
	default:
	}
	l.mu.Unlock()
	if !queued {
		s.Close()
	}
}
