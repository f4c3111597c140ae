// Package muxlink carries many byte streams over one: the host's end of a
// virtio-serial port (QEMU's unix-socket chardev) and the guest's port
// device, which admit one open at a time. Each custodian connection to a
// VM computer is one stream; the mutual TLS session between the
// custodian and the guest's receiver runs inside it, so muxlink sees
// only ciphertext and authenticates nothing itself.
//
// A frame is a 9-byte header, type (1 byte), stream id and payload
// length (4 bytes each, big endian), then the payload. The host opens
// streams (ids below GuestStreamBit); the guest may dial streams of its
// own (ids with GuestStreamBit set, dial.go) only while the host accepts
// them, at most MaxGuestStreams at once. Either end sends data and
// closes. The link starts with a
// hello carrying a nonce that the guest echoes after it has dropped
// every stream of an earlier link, so bytes left in the port from a
// previous host connection never reach a new stream.
package muxlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	typeHello byte = 0x7e // stream 0, payload: the nonce
	typeOpen  byte = 0x01 // host -> guest, empty payload
	typeData  byte = 0x02
	typeClose byte = 0x03 // empty payload: the sender will send no more and reads no more
	typeDial  byte = 0x04 // guest -> host, empty payload, a stream id with GuestStreamBit
)

// GuestStreamBit marks the ids of streams the guest dials; the host's
// own ids never carry it, so the two never collide.
const GuestStreamBit uint32 = 1 << 31

// Limits.
const (
	headerLen = 9
	// MaxPayload bounds one frame's payload.
	MaxPayload = 32 << 10
	// MaxBuffered bounds the bytes a stream holds that its reader has not
	// read; a stream over it is closed (its peer is not reading).
	MaxBuffered = 4 << 20
	nonceLen    = 16
)

// ErrFrame wraps a malformed frame.
var ErrFrame = errors.New("muxlink: malformed frame")

// frame is one decoded frame.
type frame struct {
	typ     byte
	stream  uint32
	payload []byte
}

// parseHeader checks a header and returns the frame it starts, without
// its payload, and the payload's length.
func parseHeader(h []byte) (frame, int, error) {
	if len(h) != headerLen {
		return frame{}, 0, fmt.Errorf("%w: header of %d bytes", ErrFrame, len(h))
	}
	f := frame{typ: h[0], stream: binary.BigEndian.Uint32(h[1:5])}
	n := binary.BigEndian.Uint32(h[5:9])
	switch {
	case n > MaxPayload:
		return frame{}, 0, fmt.Errorf("%w: payload of %d bytes (max %d)", ErrFrame, n, MaxPayload)
	case f.typ == typeHello && (f.stream != 0 || n != nonceLen):
		return frame{}, 0, fmt.Errorf("%w: hello on stream %d with %d bytes", ErrFrame, f.stream, n)
	case (f.typ == typeOpen || f.typ == typeClose || f.typ == typeDial) && n != 0:
		return frame{}, 0, fmt.Errorf("%w: type %#x with a payload", ErrFrame, f.typ)
	case f.typ == typeData && n == 0:
		return frame{}, 0, fmt.Errorf("%w: empty data frame", ErrFrame)
	case f.typ != typeHello && f.typ != typeOpen && f.typ != typeData && f.typ != typeClose && f.typ != typeDial:
		return frame{}, 0, fmt.Errorf("%w: unknown type %#x", ErrFrame, f.typ)
	case f.typ == typeOpen && f.stream&GuestStreamBit != 0:
		return frame{}, 0, fmt.Errorf("%w: open of stream %#x, a guest's id", ErrFrame, f.stream)
	case f.typ == typeDial && f.stream&GuestStreamBit == 0:
		return frame{}, 0, fmt.Errorf("%w: dial of stream %#x, a host's id", ErrFrame, f.stream)
	case f.typ != typeHello && f.stream == 0:
		return frame{}, 0, fmt.Errorf("%w: stream 0 is the link's", ErrFrame)
	}
	return f, int(n), nil
}

// readFrame reads one frame from r.
func readFrame(r io.Reader) (frame, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	f, n, err := parseHeader(h[:])
	if err != nil {
		return frame{}, err
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return frame{}, fmt.Errorf("%w: truncated payload: %w", ErrFrame, err)
	}
	return f, nil
}

// appendFrame appends the encoding of f to b.
func appendFrame(b []byte, f frame) []byte {
	b = append(b, f.typ)
	b = binary.BigEndian.AppendUint32(b, f.stream)
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.payload)))
	return append(b, f.payload...)
}
