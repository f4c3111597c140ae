package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxFrameSize is the protocol's hard ceiling on one frame's payload (the
// JSON object, not counting the 4-byte length). A deployment may configure
// a lower limit, never a higher one.
const MaxFrameSize = 1 << 20

// headerSize is the length prefix: a 4-byte big-endian payload length.
const headerSize = 4

// HeaderSize is headerSize, for callers that size a frame's buffer.
const HeaderSize = headerSize

// Framing and decoding failures. Every one of them is fatal to the
// connection it happened on: after a bad frame the stream can no longer be
// trusted to be in sync.
var (
	// ErrFrameTooLarge: a frame's declared length exceeds the limit. The
	// payload is never read. Use errors.As with *FrameSizeError for sizes.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrFrameEmpty: a frame declared a zero-length payload.
	ErrFrameEmpty = errors.New("wire: zero-length frame")
	// ErrFrameTruncated: the stream ended inside a frame's header or payload.
	ErrFrameTruncated = errors.New("wire: truncated frame")
	// ErrMalformed: a frame's payload is not exactly one strict JSON object
	// of the expected shape (invalid UTF-8, unknown or duplicate field, wrong
	// type, trailing data, nesting too deep).
	ErrMalformed = errors.New("wire: malformed frame")
	// ErrProtocol: a well-formed frame breaks the protocol (unknown op, id
	// 0, an id already in flight, a response to an id never sent).
	ErrProtocol = errors.New("wire: protocol violation")
	// ErrLimit: a configured frame limit is out of range (not 1..MaxFrameSize).
	ErrLimit = errors.New("wire: frame limit out of range")
)

// FrameSizeError reports a frame whose declared or encoded size exceeds the
// limit in force. It matches ErrFrameTooLarge with errors.Is.
type FrameSizeError struct {
	Size  int64 // declared (reading) or encoded (writing) payload size
	Limit int   // the limit in force
}

func (e *FrameSizeError) Error() string {
	return fmt.Sprintf("wire: frame too large: %d bytes > limit %d", e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrFrameTooLarge) true.
func (e *FrameSizeError) Is(target error) bool { return target == ErrFrameTooLarge }

// FrameLimit checks a configured frame limit: 0 means MaxFrameSize; any
// value above MaxFrameSize or below 0 is refused with ErrLimit, never
// clamped.
func FrameLimit(n int) (int, error) {
	switch {
	case n == 0:
		return MaxFrameSize, nil
	case n < 0 || n > MaxFrameSize:
		return 0, fmt.Errorf("%w: %d (allowed 1..%d)", ErrLimit, n, MaxFrameSize)
	}
	return n, nil
}

// FrameReader reads length-prefixed frames from one stream. It is not safe
// for concurrent use; the caller owns the underlying reader.
type FrameReader struct {
	r     *bufio.Reader
	limit int
	buf   []byte
}

// NewFrameReader returns a reader enforcing limit (see FrameLimit).
func NewFrameReader(r io.Reader, limit int) (*FrameReader, error) {
	limit, err := FrameLimit(limit)
	if err != nil {
		return nil, err
	}
	return &FrameReader{r: bufio.NewReaderSize(r, 64<<10), limit: limit}, nil
}

// ReadFrame returns the next frame's payload. The slice is valid only until
// the next call. A clean end of stream at a frame boundary is io.EOF (and
// a read error there is returned as is); an end inside a frame is
// ErrFrameTruncated; a declared length of zero is
// ErrFrameEmpty; a declared length above the limit is a *FrameSizeError,
// returned before any payload byte is read.
func (fr *FrameReader) ReadFrame() ([]byte, error) {
	var hdr [headerSize]byte
	if n, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		if n == 0 { // between frames: a clean end (io.EOF) or the stream's own error
			return nil, err
		}
		return nil, fmt.Errorf("%w: header: %w", ErrFrameTruncated, err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	switch {
	case size == 0:
		return nil, ErrFrameEmpty
	case int64(size) > int64(fr.limit):
		return nil, &FrameSizeError{Size: int64(size), Limit: fr.limit}
	}
	if cap(fr.buf) < int(size) {
		fr.buf = make([]byte, size)
	}
	payload := fr.buf[:size]
	if _, err := io.ReadFull(fr.r, payload); err != nil {
		if err == io.EOF { // no payload byte at all: still inside the frame, never a clean end
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%w: payload of %d bytes: %w", ErrFrameTruncated, size, err)
	}
	return payload, nil
}

// AppendFrame appends the length prefix and payload to dst. It refuses an
// empty payload and one larger than limit (see FrameLimit).
func AppendFrame(dst, payload []byte, limit int) ([]byte, error) {
	limit, err := FrameLimit(limit)
	if err != nil {
		return dst, err
	}
	switch {
	case len(payload) == 0:
		return dst, ErrFrameEmpty
	case len(payload) > limit:
		return dst, &FrameSizeError{Size: int64(len(payload)), Limit: limit}
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...), nil
}

// WriteFrame writes one frame with a single Write call, so concurrent
// writers serialised by a mutex never interleave partial frames.
func WriteFrame(w io.Writer, payload []byte, limit int) error {
	buf, err := AppendFrame(make([]byte, 0, headerSize+len(payload)), payload, limit)
	if err != nil {
		return err
	}
	_, err = w.Write(buf)
	return err
}
