package rfb

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Handshake constants (RFC 6143 section 7.1-7.3).
const (
	version38    = "RFB 003.008\n"
	securityNone = 1
	// MaxNameLength bounds the desktop name QEMU announces.
	MaxNameLength = 4096
)

// ServerInit is what the server announces after the handshake.
type ServerInit struct {
	Width, Height uint16
	Format        PixelFormat
	Name          string
}

func (s ServerInit) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, s.Width)
	b = binary.BigEndian.AppendUint16(b, s.Height)
	b = append(b, s.Format.encode()...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Name)))
	return append(b, s.Name...)
}

func handshakeErr(side, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrHandshake, side, fmt.Sprintf(format, args...))
}

// ClientHandshake runs the client half of the RFB 3.8 handshake with QEMU
// on rw: version 3.8, security type None (the pinned unix socket is the
// authentication, as for QMP), and a shared ClientInit, so one viewer can
// never disconnect the others. It returns QEMU's ServerInit. The caller
// bounds it with a deadline on the connection.
func ClientHandshake(rw io.ReadWriter) (ServerInit, error) {
	const side = "qemu"
	v := make([]byte, len(version38))
	if _, err := io.ReadFull(rw, v); err != nil {
		return ServerInit{}, handshakeErr(side, "reading the version: %v", err)
	}
	if string(v) != version38 {
		return ServerInit{}, handshakeErr(side, "version %q, want %q", v, version38)
	}
	if _, err := rw.Write([]byte(version38)); err != nil {
		return ServerInit{}, handshakeErr(side, "writing the version: %v", err)
	}
	if err := chooseNone(rw); err != nil {
		return ServerInit{}, err
	}
	if _, err := rw.Write([]byte{1}); err != nil { // ClientInit: shared
		return ServerInit{}, handshakeErr(side, "writing ClientInit: %v", err)
	}
	return readServerInit(rw)
}

// chooseNone reads QEMU's security types, picks None and checks the result.
func chooseNone(rw io.ReadWriter) error {
	const side = "qemu"
	var n [1]byte
	if _, err := io.ReadFull(rw, n[:]); err != nil {
		return handshakeErr(side, "reading security types: %v", err)
	}
	if n[0] == 0 {
		return handshakeErr(side, "connection refused: %s", readReason(rw))
	}
	types := make([]byte, n[0])
	if _, err := io.ReadFull(rw, types); err != nil {
		return handshakeErr(side, "reading security types: %v", err)
	}
	found := false
	for _, t := range types {
		found = found || t == securityNone
	}
	if !found {
		return handshakeErr(side, "security types %v do not offer None: the VNC socket must be a pinned unix socket without password or TLS", types)
	}
	if _, err := rw.Write([]byte{securityNone}); err != nil {
		return handshakeErr(side, "choosing None: %v", err)
	}
	var res [4]byte
	if _, err := io.ReadFull(rw, res[:]); err != nil {
		return handshakeErr(side, "reading the security result: %v", err)
	}
	if binary.BigEndian.Uint32(res[:]) != 0 {
		return handshakeErr(side, "security result failed: %s", readReason(rw))
	}
	return nil
}

// readReason reads a bounded failure reason; it never fails.
func readReason(r io.Reader) string {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return "(no reason)"
	}
	n := min(binary.BigEndian.Uint32(l[:]), 256)
	b := make([]byte, n)
	k, _ := io.ReadFull(r, b)
	return fmt.Sprintf("%q", b[:k])
}

func readServerInit(r io.Reader) (ServerInit, error) {
	const side = "qemu"
	b := make([]byte, 24)
	if _, err := io.ReadFull(r, b); err != nil {
		return ServerInit{}, handshakeErr(side, "reading ServerInit: %v", err)
	}
	pf, err := decodePixelFormat(-1, b[4:20])
	if err != nil {
		return ServerInit{}, handshakeErr(side, "ServerInit pixel format: %v", err)
	}
	n := binary.BigEndian.Uint32(b[20:])
	if n > MaxNameLength {
		return ServerInit{}, handshakeErr(side, "desktop name of %d bytes", n)
	}
	name := make([]byte, n)
	if _, err := io.ReadFull(r, name); err != nil {
		return ServerInit{}, handshakeErr(side, "reading the desktop name: %v", err)
	}
	return ServerInit{Width: be16(b), Height: be16(b[2:]), Format: pf, Name: string(name)}, nil
}

// ServerHandshake runs the server half of the RFB 3.8 handshake with a
// viewer on rw: version 3.8 only, security type None only (the viewer was
// authenticated by its cookie before the WebSocket opened), any
// ClientInit, then init. The caller bounds it with a deadline.
func ServerHandshake(rw io.ReadWriter, init ServerInit) error {
	const side = "viewer"
	if _, err := rw.Write([]byte(version38)); err != nil {
		return handshakeErr(side, "writing the version: %v", err)
	}
	v := make([]byte, len(version38))
	if _, err := io.ReadFull(rw, v); err != nil {
		return handshakeErr(side, "reading the version: %v", err)
	}
	if string(v) != version38 {
		return handshakeErr(side, "version %q, want %q", v, version38)
	}
	if _, err := rw.Write([]byte{1, securityNone}); err != nil {
		return handshakeErr(side, "offering security types: %v", err)
	}
	var b [1]byte
	if _, err := io.ReadFull(rw, b[:]); err != nil || b[0] != securityNone {
		return handshakeErr(side, "security type %d (%v), want None", b[0], err)
	}
	if _, err := rw.Write([]byte{0, 0, 0, 0}); err != nil {
		return handshakeErr(side, "writing the security result: %v", err)
	}
	if _, err := io.ReadFull(rw, b[:]); err != nil {
		return handshakeErr(side, "reading ClientInit: %v", err)
	}
	if _, err := rw.Write(init.encode()); err != nil {
		return handshakeErr(side, "writing ServerInit: %v", err)
	}
	return nil
}
