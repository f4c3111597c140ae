package wire

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tetherdev/tether/admission/errcode"
)

// Binary data frames (docs/protocol.md "Binary data frames") carry the
// bytes of one write_chunk request or one read_chunk answer raw, not in
// base64 inside JSON. A binary frame's payload is
//
//	version byte (BinaryV1) | 4-byte big-endian length H | H bytes of header |
//	data | 32-byte SHA-256 of data
//
// The header is the strict JSON request or response the frame would be,
// without the data member (args of write_chunk, result of read_chunk);
// the data fills that member. Every other op, and every error, stays a
// JSON frame. A JSON payload begins with '{' (or JSON whitespace), never
// with a byte of 0x80 or above, so the first byte tells the two apart.
//
// A peer uses binary frames only after the other side accepted a request
// that asked for them (ReadChunkArgs.Binary, WriteBeginArgs.Binary): a
// receiver that predates them refuses that field by name (unknown field)
// before any binary frame is sent, so an old peer sees a clear refusal,
// never bytes it would misread.
const (
	// BinaryV1 is the first byte of a binary frame of version 1.
	BinaryV1 byte = 0xB1
	// binaryVersionMask tells a binary frame of any version (0xB0..0xBF) from
	// JSON; only BinaryV1 is decoded, the others are ErrProtocol by version.
	binaryVersionMask = 0xF0
	binaryPrefix      = 1 + 4
	// BinaryDigestSize is the trailing SHA-256 of a binary frame's data.
	BinaryDigestSize = sha256.Size
	// BinaryOverhead is a binary frame's payload bytes beyond header and data.
	BinaryOverhead = binaryPrefix + BinaryDigestSize
)

// ErrDigest: a binary frame's data does not match its trailing SHA-256. It
// wraps ErrMalformed (fatal to the connection).
var ErrDigest = fmt.Errorf("%w: binary frame data does not match its sha256", ErrMalformed)

// IsBinary reports whether payload is a binary frame (of any version).
func IsBinary(payload []byte) bool {
	return len(payload) > 0 && payload[0]&binaryVersionMask == BinaryV1&binaryVersionMask
}

// AppendBinary appends a binary frame payload (not its length prefix) of
// header and data to dst. The caller checks the frame limit (AppendFrame).
func AppendBinary(dst, header, data []byte) []byte {
	dst = append(dst, BinaryV1)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(header)))
	dst = append(append(dst, header...), data...)
	sum := sha256.Sum256(data)
	return append(dst, sum[:]...)
}

// splitBinary checks a binary frame payload and returns its header and
// data, both aliasing payload. A version other than BinaryV1 is
// ErrProtocol; a length out of range, an empty header or a digest that
// does not match is ErrMalformed.
func splitBinary(payload []byte) (header, data []byte, err error) {
	switch {
	case !IsBinary(payload):
		return nil, nil, fmt.Errorf("%w: not a binary frame", ErrMalformed)
	case payload[0] != BinaryV1:
		return nil, nil, fmt.Errorf("%w: binary frame version %#x is not supported (only %#x)", ErrProtocol, payload[0], BinaryV1)
	case len(payload) < BinaryOverhead:
		return nil, nil, fmt.Errorf("%w: binary frame of %d bytes is shorter than its %d fixed bytes", ErrMalformed, len(payload), BinaryOverhead)
	}
	h := binary.BigEndian.Uint32(payload[1:binaryPrefix])
	if h == 0 || uint64(h) > uint64(len(payload)-BinaryOverhead) {
		return nil, nil, fmt.Errorf("%w: binary frame header length %d out of range (frame %d bytes)", ErrMalformed, h, len(payload))
	}
	header = payload[binaryPrefix : binaryPrefix+int(h)]
	data = payload[binaryPrefix+int(h) : len(payload)-BinaryDigestSize]
	sum := sha256.Sum256(data)
	if subtle.ConstantTimeCompare(sum[:], payload[len(payload)-BinaryDigestSize:]) != 1 {
		return nil, nil, ErrDigest
	}
	return header, data, nil
}

// DecodeRequestFrame decodes one request frame payload, JSON
// (DecodeRequest) or binary (DecodeBinaryRequest). The server calls it.
func DecodeRequestFrame(payload []byte) (*Request, error) {
	if IsBinary(payload) {
		return DecodeBinaryRequest(payload)
	}
	return DecodeRequest(payload)
}

// DecodeBinaryRequest decodes a binary request frame: only write_chunk,
// whose header's args carry no data (data absent or null); the frame's
// data, copied out of payload, becomes WriteChunkArgs.Data, and the args
// are then validated as a JSON write_chunk's are. Failures are those of
// DecodeRequest; an op other than write_chunk is ErrProtocol.
func DecodeBinaryRequest(payload []byte) (*Request, error) {
	header, data, err := splitBinary(payload)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	var req Request
	raw, err := decodeStrictExcept(header, &req, "args")
	if err != nil {
		return nil, fmt.Errorf("binary request: %w", err)
	}
	req.Args = raw
	switch {
	case req.ID == 0:
		return nil, fmt.Errorf("%w: request id 0 is reserved", ErrProtocol)
	case req.Op != OpWriteChunk:
		return nil, fmt.Errorf("%w: op %q cannot travel in a binary frame (only %s)", ErrProtocol, req.Op, OpWriteChunk)
	case len(raw) == 0:
		return nil, fmt.Errorf("%w: binary request %d: args missing", ErrMalformed, req.ID)
	}
	var a WriteChunkArgs
	if err := decodeStrict(raw, &a); err != nil {
		return nil, fmt.Errorf("binary request %d: op %s args: %w", req.ID, req.Op, err)
	}
	if a.Data != nil {
		return nil, fmt.Errorf("%w: binary request %d: data both in the header and in the frame", ErrMalformed, req.ID)
	}
	a.Data = append([]byte(nil), data...) // the frame's buffer is reused by the next read
	if e := a.validate(); e != nil {
		return &req, e
	}
	req.args = &a
	if e := checkEnvelope(&req); e != nil {
		return &req, e
	}
	return &req, nil
}

// EncodeBinaryRequest encodes req (whose Args are write_chunk's, without
// data) and data as a binary frame payload.
func EncodeBinaryRequest(req *Request, data []byte) ([]byte, error) {
	if req.Op != OpWriteChunk {
		return nil, fmt.Errorf("%w: op %q cannot travel in a binary frame", ErrProtocol, req.Op)
	}
	header, err := encodeRequest(req)
	if err != nil {
		return nil, err
	}
	return AppendBinary(make([]byte, 0, len(header)+len(data)+BinaryOverhead), header, data), nil
}

// readChunkHead is a read_chunk result without its data: the header of a
// binary read_chunk answer.
type readChunkHead struct {
	Size int64 `json:"size"`
}

// EncodeBinaryReadChunk encodes the answer id to a read_chunk that asked
// for a binary answer.
func EncodeBinaryReadChunk(id uint64, res *ReadChunkResult) ([]byte, error) {
	head, err := json.Marshal(struct {
		ID     uint64        `json:"id"`
		Result readChunkHead `json:"result"`
	}{id, readChunkHead{Size: res.Size}})
	if err != nil {
		return nil, err
	}
	return AppendBinary(make([]byte, 0, len(head)+len(res.Data)+BinaryOverhead), head, res.Data), nil
}

// DecodeResponseFrame decodes one answer frame payload, JSON
// (DecodeResponse) or binary (DecodeBinaryResponse). The client calls it.
func DecodeResponseFrame(payload []byte) (*Response, error) {
	if IsBinary(payload) {
		return DecodeBinaryResponse(payload)
	}
	return DecodeResponse(payload)
}

// DecodeBinaryResponse decodes a binary answer: a header with an id other
// than 0 and a result (never an error, which is always JSON), and the
// frame's data, copied out of payload into Response.Data. Which op the
// answer is for is the client's to check (only read_chunk may have one).
func DecodeBinaryResponse(payload []byte) (*Response, error) {
	header, data, err := splitBinary(payload)
	if err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	resp, err := DecodeResponse(header)
	switch {
	case err != nil:
		return nil, fmt.Errorf("binary %w", err)
	case resp.ID == 0 || resp.Error != nil:
		return nil, fmt.Errorf("%w: binary response %d carries an error or is a notice", ErrProtocol, resp.ID)
	}
	resp.Data = append([]byte{}, data...)
	resp.Binary = true
	return resp, nil
}

// BinaryReadChunkResult decodes the result of a binary read_chunk answer:
// the header's result strictly (size only; a data member is refused) and
// the frame's data.
func BinaryReadChunkResult(resp *Response, res *ReadChunkResult) error {
	if !resp.Binary {
		return errors.New("wire: not a binary answer")
	}
	var head readChunkHead
	if err := decodeStrict(resp.Result, &head); err != nil {
		return err
	}
	*res = ReadChunkResult{Data: resp.Data, Size: head.Size}
	return nil
}

// WantsBinary reports whether r is a read_chunk that asked for a binary
// answer (the server answers such a request's result in a binary frame).
func (r *Request) WantsBinary() bool {
	a, ok := r.args.(*ReadChunkArgs)
	return ok && a.Binary
}

// BinaryAnswerTooLarge is the refusal of a binary answer of n bytes over
// the frame limit (the server answers it in JSON).
func BinaryAnswerTooLarge(n, limit int) *errcode.Error {
	return errcode.Errorf(errcode.CodeTooLarge, "answer of %d bytes exceeds the frame limit of %d", n, limit)
}
