package opstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/strictjson"
)

// Intent is the record made durable before a keyed request is dispatched:
// enough to answer a retry and to write an Interrupted receipt if no result
// ever arrives.
type Intent struct {
	OpKey         string    `json:"op_key"`
	RequestSHA256 string    `json:"request_sha256"`
	Method        string    `json:"method"`
	SessionID     string    `json:"session_id"`
	TupleSHA256   string    `json:"tuple_sha256"`
	Principal     string    `json:"principal"`
	LeaseNotAfter time.Time `json:"lease_not_after"`
	DispatchedAt  time.Time `json:"dispatched_at"`
	RetainUntil   time.Time `json:"retain_until"`
	// TaggedBy is "custodian" when the custodian minted the op key for a
	// plain agent's callback (docs/custodian.md "Plain agents"); empty when
	// the agent tagged the callback itself.
	TaggedBy string `json:"tagged_by,omitempty"`
}

// validate refuses an intent the store could not answer a retry for.
func (in *Intent) validate() error {
	switch {
	case !acpmeta.ValidOpKey(in.OpKey):
		return fmt.Errorf("%w: op key %q is not 1-128 of [A-Za-z0-9._:-]", ErrInvalid, in.OpKey)
	case !acpmeta.ValidDigest(in.RequestSHA256):
		return fmt.Errorf("%w: request digest is not a lowercase hex SHA-256", ErrInvalid)
	case in.Method == "":
		return fmt.Errorf("%w: method is required", ErrInvalid)
	}
	return nil
}

// Framing of one intent record in a segment file:
//
//	[4-byte big-endian payload length][4-byte CRC-32C of payload][payload JSON]
const (
	frameHeader    = 8
	maxIntentBytes = 64 << 10
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// appendFrame appends the framed encoding of in to buf.
func appendFrame(buf []byte, in *Intent) ([]byte, error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return buf, fmt.Errorf("encode intent: %w", err)
	}
	if len(payload) > maxIntentBytes {
		return buf, fmt.Errorf("%w: intent record is %d bytes, limit %d", ErrInvalid, len(payload), maxIntentBytes)
	}
	var hdr [frameHeader]byte
	binary.BigEndian.PutUint32(hdr[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(hdr[4:8], crc32.Checksum(payload, crcTable))
	buf = append(buf, hdr[:]...)
	return append(buf, payload...), nil
}

// errTorn marks an incomplete last record: a crash interrupted its append,
// so it was never acknowledged as durable and its request never dispatched.
var errTorn = errors.New("torn tail")

// ScanSegment decodes every intent in one segment. valid is the length of
// the prefix made of complete records. A damaged last record (short,
// zero-filled or with a bad checksum and nothing after it) is a torn tail:
// it is reported through valid < len(data) and is not an error, because its
// append never returned. Damage followed by more data is corruption and
// fails with ErrCorrupt: the store refuses to guess which keys were sent.
func ScanSegment(data []byte) (intents []Intent, valid int, err error) {
	off := 0
	for off < len(data) {
		in, n, err := decodeFrame(data[off:])
		if errors.Is(err, errTorn) {
			return intents, off, nil
		}
		if err != nil {
			return intents, off, fmt.Errorf("%w: intent log at offset %d: %w", ErrCorrupt, off, err)
		}
		intents = append(intents, in)
		off += n
	}
	return intents, off, nil
}

// decodeFrame decodes the first record of b and returns its framed length.
func decodeFrame(b []byte) (Intent, int, error) {
	if len(b) < frameHeader {
		return Intent{}, 0, errTorn
	}
	n := int(binary.BigEndian.Uint32(b[0:4]))
	if n == 0 {
		if allZero(b) {
			return Intent{}, 0, errTorn
		}
		return Intent{}, 0, errors.New("zero-length record")
	}
	if n > maxIntentBytes {
		return Intent{}, 0, fmt.Errorf("record length %d over limit %d", n, maxIntentBytes)
	}
	if len(b) < frameHeader+n {
		return Intent{}, 0, errTorn
	}
	payload := b[frameHeader : frameHeader+n]
	if crc32.Checksum(payload, crcTable) != binary.BigEndian.Uint32(b[4:8]) {
		if len(b) == frameHeader+n || allZero(b[frameHeader+n:]) {
			return Intent{}, 0, errTorn
		}
		return Intent{}, 0, errors.New("checksum mismatch")
	}
	var in Intent
	if err := strictjson.Decode(payload, maxIntentBytes, &in); err != nil {
		return Intent{}, 0, err
	}
	if err := in.validate(); err != nil {
		return Intent{}, 0, err
	}
	return in, frameHeader + n, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
