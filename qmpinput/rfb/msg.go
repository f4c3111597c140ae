package rfb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Client message types (RFC 6143 section 7.5, and QEMU's extension 255).
const (
	typeSetPixelFormat = 0
	typeSetEncodings   = 2
	typeUpdateRequest  = 3
	typeKeyEvent       = 4
	typePointerEvent   = 5
	typeClientCutText  = 6
	typeQEMU           = 255
	qemuExtKeyEvent    = 0 // the only QEMU submessage accepted
)

// Bounds of the variable-length client messages.
const (
	// MaxEncodings bounds one SetEncodings (noVNC sends about 30).
	MaxEncodings = 128
	// MaxCutText bounds one ClientCutText; its bytes are read and dropped.
	MaxCutText = 1 << 20
)

// Errors callers branch on.
var (
	// ErrMalformed: a client message is unknown, truncated, out of bounds
	// or has a field outside its domain. It is fatal to that viewer.
	ErrMalformed = errors.New("rfb: malformed client message")
	// ErrHandshake: the RFB handshake with the viewer or with QEMU failed.
	ErrHandshake = errors.New("rfb: handshake failed")
)

// MalformedError names the message type and the check it failed.
type MalformedError struct {
	Type   int // the message type byte; -1 before it was read
	Reason string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("%v: type %d: %s", ErrMalformed, e.Type, e.Reason)
}

func (e *MalformedError) Unwrap() error { return ErrMalformed }

func malformed(t int, format string, args ...any) error {
	return &MalformedError{Type: t, Reason: fmt.Sprintf(format, args...)}
}

// Msg is one parsed client-to-server message. The set is closed: a
// message is one of the types below or it was refused as malformed.
// Encode gives the bytes the proxy forwards: every forwarded message is
// re-encoded from its parsed fields, so no unparsed byte reaches QEMU.
type Msg interface {
	isMsg()
	Encode() []byte
}

// PixelFormat is the 16-byte RFB pixel format.
type PixelFormat struct {
	BitsPerPixel, Depth             uint8
	BigEndian, TrueColour           bool
	RedMax, GreenMax, BlueMax       uint16
	RedShift, GreenShift, BlueShift uint8
}

// SetPixelFormat asks for another pixel format.
type SetPixelFormat struct{ Format PixelFormat }

// SetEncodings lists the encodings the viewer accepts, in preference order.
type SetEncodings struct{ Encodings []int32 }

// UpdateRequest asks for a framebuffer update of a rectangle.
type UpdateRequest struct {
	Incremental bool
	X, Y, W, H  uint16
}

// KeyEvent presses or releases the key with an X keysym.
type KeyEvent struct {
	Down   bool
	Keysym uint32
}

// ExtKeyEvent is QEMU's extended key event: a keysym plus the XT scan
// code of the physical key (noVNC sends it when QEMU offers it).
type ExtKeyEvent struct {
	Down    bool
	Keysym  uint32
	Keycode uint32
}

// PointerEvent moves the pointer to (X, Y) with the button mask.
type PointerEvent struct {
	Mask uint8
	X, Y uint16
}

// CutText is a ClientCutText (clipboard) message. Only its length is
// kept: the content is read and dropped, never forwarded.
type CutText struct{ Length uint32 }

func (SetPixelFormat) isMsg() {}
func (SetEncodings) isMsg()   {}
func (UpdateRequest) isMsg()  {}
func (KeyEvent) isMsg()       {}
func (ExtKeyEvent) isMsg()    {}
func (PointerEvent) isMsg()   {}
func (CutText) isMsg()        {}

// IsInput reports whether m is keyboard or pointer input, which reaches
// the guest only from the viewer that holds control.
func IsInput(m Msg) bool {
	switch m.(type) {
	case KeyEvent, ExtKeyEvent, PointerEvent:
		return true
	}
	return false
}

// ReadClientMessage reads exactly one client message from r. Unknown
// types, QEMU submessages other than the extended key event, truncation,
// flags other than 0 or 1, a pixel format QEMU cannot take, more than
// MaxEncodings encodings and a cut text longer than MaxCutText are
// refused with a *MalformedError; the caller then drops the viewer.
func ReadClientMessage(r io.Reader) (Msg, error) {
	var t [1]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return nil, err // a clean EOF between messages is not malformed
	}
	switch t[0] {
	case typeSetPixelFormat:
		return readPixelFormat(r)
	case typeSetEncodings:
		return readEncodings(r)
	case typeUpdateRequest:
		return readUpdateRequest(r)
	case typeKeyEvent:
		return readKeyEvent(r)
	case typePointerEvent:
		return readPointerEvent(r)
	case typeClientCutText:
		return readCutText(r)
	case typeQEMU:
		return readQEMU(r)
	}
	return nil, malformed(int(t[0]), "unknown message type")
}

// body reads the n bytes after the type byte.
func body(r io.Reader, t, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, malformed(t, "truncated after %d bytes: %v", n, err)
	}
	return b, nil
}

func flag(t int, name string, v uint64) (bool, error) {
	if v > 1 {
		return false, malformed(t, "%s flag %d is neither 0 nor 1", name, v)
	}
	return v == 1, nil
}

func readPixelFormat(r io.Reader) (Msg, error) {
	b, err := body(r, typeSetPixelFormat, 19)
	if err != nil {
		return nil, err
	}
	pf, err := decodePixelFormat(typeSetPixelFormat, b[3:19])
	if err != nil {
		return nil, err
	}
	return SetPixelFormat{Format: pf}, nil
}

func decodePixelFormat(t int, b []byte) (PixelFormat, error) {
	pf := PixelFormat{BitsPerPixel: b[0], Depth: b[1],
		RedMax: binary.BigEndian.Uint16(b[4:]), GreenMax: binary.BigEndian.Uint16(b[6:]), BlueMax: binary.BigEndian.Uint16(b[8:]),
		RedShift: b[10], GreenShift: b[11], BlueShift: b[12]}
	var err error
	if pf.BigEndian, err = flag(t, "big-endian", uint64(b[2])); err != nil {
		return pf, err
	}
	if pf.TrueColour, err = flag(t, "true-colour", uint64(b[3])); err != nil {
		return pf, err
	}
	if pf.BitsPerPixel != 8 && pf.BitsPerPixel != 16 && pf.BitsPerPixel != 32 {
		return pf, malformed(t, "bits per pixel %d (8, 16 or 32)", pf.BitsPerPixel)
	}
	if pf.Depth == 0 || pf.Depth > pf.BitsPerPixel {
		return pf, malformed(t, "depth %d for %d bits per pixel", pf.Depth, pf.BitsPerPixel)
	}
	return pf, nil
}

func readEncodings(r io.Reader) (Msg, error) {
	b, err := body(r, typeSetEncodings, 3)
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if n > MaxEncodings {
		return nil, malformed(typeSetEncodings, "%d encodings (at most %d)", n, MaxEncodings)
	}
	list, err := body(r, typeSetEncodings, 4*n)
	if err != nil {
		return nil, err
	}
	m := SetEncodings{Encodings: make([]int32, n)}
	for i := range n {
		m.Encodings[i] = int32(binary.BigEndian.Uint32(list[4*i:]))
	}
	return m, nil
}

func readUpdateRequest(r io.Reader) (Msg, error) {
	b, err := body(r, typeUpdateRequest, 9)
	if err != nil {
		return nil, err
	}
	inc, err := flag(typeUpdateRequest, "incremental", uint64(b[0]))
	if err != nil {
		return nil, err
	}
	return UpdateRequest{Incremental: inc, X: be16(b[1:]), Y: be16(b[3:]), W: be16(b[5:]), H: be16(b[7:])}, nil
}

func readKeyEvent(r io.Reader) (Msg, error) {
	b, err := body(r, typeKeyEvent, 7)
	if err != nil {
		return nil, err
	}
	down, err := flag(typeKeyEvent, "down", uint64(b[0]))
	if err != nil {
		return nil, err
	}
	return KeyEvent{Down: down, Keysym: binary.BigEndian.Uint32(b[3:])}, nil
}

func readPointerEvent(r io.Reader) (Msg, error) {
	b, err := body(r, typePointerEvent, 5)
	if err != nil {
		return nil, err
	}
	return PointerEvent{Mask: b[0], X: be16(b[1:]), Y: be16(b[3:])}, nil
}

// readCutText reads and drops a ClientCutText. A negative length (the
// top bit set) is the extended clipboard's form; its absolute value is
// bounded the same way.
func readCutText(r io.Reader) (Msg, error) {
	b, err := body(r, typeClientCutText, 7)
	if err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(b[3:])
	if int32(n) < 0 {
		n = uint32(-int64(int32(n)))
	}
	if n > MaxCutText {
		return nil, malformed(typeClientCutText, "cut text of %d bytes (at most %d)", n, MaxCutText)
	}
	if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
		return nil, malformed(typeClientCutText, "cut text truncated: %v", err)
	}
	return CutText{Length: n}, nil
}

func readQEMU(r io.Reader) (Msg, error) {
	b, err := body(r, typeQEMU, 1)
	if err != nil {
		return nil, err
	}
	if b[0] != qemuExtKeyEvent {
		return nil, malformed(typeQEMU, "QEMU submessage %d (only the extended key event is accepted)", b[0])
	}
	k, err := body(r, typeQEMU, 10)
	if err != nil {
		return nil, err
	}
	down, err := flag(typeQEMU, "down", uint64(be16(k)))
	if err != nil {
		return nil, err
	}
	return ExtKeyEvent{Down: down, Keysym: binary.BigEndian.Uint32(k[2:]), Keycode: binary.BigEndian.Uint32(k[6:])}, nil
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Encode returns the 20-byte SetPixelFormat.
func (m SetPixelFormat) Encode() []byte {
	b := []byte{typeSetPixelFormat, 0, 0, 0}
	return append(b, m.Format.encode()...)
}

func (pf PixelFormat) encode() []byte {
	b := []byte{pf.BitsPerPixel, pf.Depth, b2u(pf.BigEndian), b2u(pf.TrueColour)}
	b = binary.BigEndian.AppendUint16(b, pf.RedMax)
	b = binary.BigEndian.AppendUint16(b, pf.GreenMax)
	b = binary.BigEndian.AppendUint16(b, pf.BlueMax)
	return append(b, pf.RedShift, pf.GreenShift, pf.BlueShift, 0, 0, 0)
}

// Encode returns the SetEncodings message.
func (m SetEncodings) Encode() []byte {
	b := []byte{typeSetEncodings, 0}
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Encodings)))
	for _, e := range m.Encodings {
		b = binary.BigEndian.AppendUint32(b, uint32(e))
	}
	return b
}

// Encode returns the 10-byte FramebufferUpdateRequest.
func (m UpdateRequest) Encode() []byte {
	b := []byte{typeUpdateRequest, b2u(m.Incremental)}
	for _, v := range []uint16{m.X, m.Y, m.W, m.H} {
		b = binary.BigEndian.AppendUint16(b, v)
	}
	return b
}

// Encode returns the 8-byte KeyEvent.
func (m KeyEvent) Encode() []byte {
	return binary.BigEndian.AppendUint32([]byte{typeKeyEvent, b2u(m.Down), 0, 0}, m.Keysym)
}

// Encode returns the 12-byte QEMU extended key event.
func (m ExtKeyEvent) Encode() []byte {
	b := []byte{typeQEMU, qemuExtKeyEvent, 0, b2u(m.Down)}
	b = binary.BigEndian.AppendUint32(b, m.Keysym)
	return binary.BigEndian.AppendUint32(b, m.Keycode)
}

// Encode returns the 6-byte PointerEvent.
func (m PointerEvent) Encode() []byte {
	b := []byte{typePointerEvent, m.Mask}
	b = binary.BigEndian.AppendUint16(b, m.X)
	return binary.BigEndian.AppendUint16(b, m.Y)
}

// Encode returns nothing: clipboard content is never forwarded.
func (CutText) Encode() []byte { return nil }
