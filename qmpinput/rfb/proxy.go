package rfb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy timeouts.
const (
	// HandshakeTimeout bounds both halves of the handshake.
	HandshakeTimeout = 10 * time.Second
	// writeTimeout bounds one write to QEMU: an input write runs while the
	// arbiter's gate is held, so it must not block a takeover for long.
	writeTimeout = 5 * time.Second
	// DefaultRefreshEvery is how often a session reminds QEMU that a
	// viewer is active; see refreshNudge.
	DefaultRefreshEvery = 100 * time.Millisecond
)

// refreshNudge is QEMU's "audio capture off" message (QEMU extension 255,
// submessage 1, operation 1). QEMU's VNC server backs its screen refresh
// off from 30 ms to 3 s while nothing changes, and resets it to 30 ms on
// any client message of type above 3 (ui/vnc.c, protocol_client_msg). A
// viewer watching a still screen sends nothing, so after a quiet minute a
// change would wait up to 3 s. The session sends this message itself (a
// viewer's own QEMU submessages other than the extended key event are
// refused): with audio off, as in every tether VM, it changes nothing
// but the refresh interval. It is neither input nor clipboard.
type refreshNudge struct{}

func (refreshNudge) isMsg() {}

// Encode returns the 4-byte message.
func (refreshNudge) Encode() []byte { return []byte{typeQEMU, 1, 0, 1} }

// Gate decides whether one viewer's input reaches the guest.
type Gate interface {
	// Input calls send only while the viewer holds control, and keeps
	// control from changing hands until send returns. It reports whether
	// send ran, and send's error.
	Input(send func() error) (bool, error)
}

// Stats counts what one session carried. All fields are safe to read
// while the session runs.
type Stats struct {
	ToViewer         atomic.Int64 // bytes QEMU sent the viewer
	ToQEMU           atomic.Int64 // bytes forwarded to QEMU
	InputForwarded   atomic.Int64 // key and pointer events forwarded
	InputDropped     atomic.Int64 // key and pointer events from a viewer without control
	CutTextDropped   atomic.Int64 // ClientCutText messages (always dropped)
	EncodingsRemoved atomic.Int64 // encodings removed from SetEncodings
}

// Session proxies one viewer to its own connection to QEMU's VNC server
// after Handshake. Bytes from QEMU reach the viewer unchanged; every byte
// from the viewer is parsed (ReadClientMessage), and only re-encoded
// messages reach QEMU: input only through the Gate, never clipboard, and
// SetEncodings filtered. A malformed message ends the session. Run closes
// both connections before it returns; Close is safe twice.
type Session struct {
	// RefreshEvery is the period of the refresh nudge (see refreshNudge);
	// NewSession sets DefaultRefreshEvery, zero turns it off. Set it
	// before Run.
	RefreshEvery time.Duration

	viewer, qemu net.Conn
	gate         Gate
	stats        Stats

	wmu     sync.Mutex // serialises writes to QEMU and the pressed state
	keys    map[uint64]Msg
	pointer PointerEvent

	closeOnce sync.Once
}

// NewSession returns a session over two connections that finished
// Handshake. gate decides about this viewer's input.
func NewSession(viewer, qemu net.Conn, gate Gate) *Session {
	return &Session{RefreshEvery: DefaultRefreshEvery, viewer: viewer, qemu: qemu, gate: gate, keys: map[uint64]Msg{}}
}

// Handshake runs the client handshake with QEMU, then the server
// handshake with the viewer, announcing QEMU's screen under name. Both are
// bounded by ctx and HandshakeTimeout.
func Handshake(ctx context.Context, viewer, qemu net.Conn, name string) (ServerInit, error) {
	dl := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	for _, c := range []net.Conn{viewer, qemu} {
		c.SetDeadline(dl)
		defer c.SetDeadline(time.Time{})
	}
	init, err := ClientHandshake(qemu)
	if err != nil {
		return init, err
	}
	init.Name = name
	return init, ServerHandshake(viewer, init)
}

// Stats returns the session's counters.
func (s *Session) Stats() *Stats { return &s.stats }

// Close closes both connections, which ends Run.
func (s *Session) Close() {
	s.closeOnce.Do(func() {
		s.viewer.Close()
		s.qemu.Close()
	})
}

// Run carries the session until the viewer or QEMU closes, a message is
// malformed, a write fails or ctx ends. It returns why: nil for a viewer
// that closed cleanly, a *MalformedError, or the I/O or ctx error. Both
// goroutines it starts are joined before it returns.
func (s *Session) Run(ctx context.Context) error {
	errc := make(chan error, 3)
	stop := make(chan struct{})
	go func() { errc <- s.fromQEMU() }()
	go func() { errc <- s.fromViewer() }()
	go func() { errc <- s.nudge(stop) }()
	var err error
	left := 3
	select {
	case err = <-errc:
		left--
	case <-ctx.Done():
		err = ctx.Err()
	}
	close(stop)
	s.Close()
	for ; left > 0; left-- {
		<-errc
	}
	return err
}

// nudge keeps QEMU's refresh interval short while the session runs.
func (s *Session) nudge(stop <-chan struct{}) error {
	if s.RefreshEvery <= 0 {
		<-stop
		return nil
	}
	t := time.NewTicker(s.RefreshEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-t.C:
			if err := s.write(refreshNudge{}); err != nil {
				return err
			}
		}
	}
}

// fromQEMU copies QEMU's stream to the viewer unchanged.
func (s *Session) fromQEMU() error {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.qemu.Read(buf)
		if n > 0 {
			if _, werr := s.viewer.Write(buf[:n]); werr != nil {
				return fmt.Errorf("rfb: writing to the viewer: %w", werr)
			}
			s.stats.ToViewer.Add(int64(n))
		}
		if err != nil {
			return fmt.Errorf("rfb: reading from qemu: %w", err)
		}
	}
}

// fromViewer parses the viewer's stream message by message.
func (s *Session) fromViewer() error {
	br := bufio.NewReaderSize(s.viewer, 16<<10)
	for {
		m, err := ReadClientMessage(br)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.handle(m); err != nil {
			return err
		}
	}
}

func (s *Session) handle(m Msg) error {
	switch v := m.(type) {
	case CutText:
		s.stats.CutTextDropped.Add(1)
		return nil
	case SetEncodings:
		f, removed := FilterEncodings(v)
		s.stats.EncodingsRemoved.Add(int64(removed))
		return s.write(f)
	case KeyEvent, ExtKeyEvent, PointerEvent:
		sent, err := s.gate.Input(func() error { return s.input(m) })
		if !sent {
			s.stats.InputDropped.Add(1)
		}
		return err
	}
	return s.write(m)
}

// input forwards one input message and remembers what is held down.
func (s *Session) input(m Msg) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	switch v := m.(type) {
	case KeyEvent:
		s.track(uint64(v.Keysym), v.Down, KeyEvent{Keysym: v.Keysym})
	case ExtKeyEvent:
		s.track(1<<32|uint64(v.Keycode), v.Down, ExtKeyEvent{Keysym: v.Keysym, Keycode: v.Keycode})
	case PointerEvent:
		s.pointer = v
	}
	s.stats.InputForwarded.Add(1)
	return s.writeLocked(m)
}

func (s *Session) track(id uint64, down bool, up Msg) {
	if down {
		s.keys[id] = up
	} else {
		delete(s.keys, id)
	}
}

// Release sends QEMU a key-up for every key this viewer holds down and
// releases its pointer buttons. The arbiter calls it when control leaves
// the viewer, before anyone else may send input, so no key stays held
// into the agent's or another person's turn.
func (s *Session) Release() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var errs []error
	for id, up := range s.keys {
		errs = append(errs, s.writeLocked(up))
		delete(s.keys, id)
	}
	if s.pointer.Mask != 0 {
		s.pointer.Mask = 0
		errs = append(errs, s.writeLocked(s.pointer))
	}
	return errors.Join(errs...)
}

func (s *Session) write(m Msg) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.writeLocked(m)
}

func (s *Session) writeLocked(m Msg) error {
	b := m.Encode()
	s.qemu.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := s.qemu.Write(b); err != nil {
		return fmt.Errorf("rfb: writing to qemu: %w", err)
	}
	s.stats.ToQEMU.Add(int64(len(b)))
	return nil
}
