// Package auditlog is the live view's hash-chained audit log: one JSON
// object per line in the state directory, each naming the SHA-256 of the
// line before it. It records who took over, handed back, paused, resumed,
// minted and revoked, with role, scope and durations, and never content:
// the record type has no field that could carry a keystroke or a pixel,
// and Verify refuses a line with any field outside that closed schema.
//
// Writers in several processes (the view server, tether-qmp token) append
// under an exclusive lock on the log file; each append is fsynced before
// it returns.
package auditlog

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/tetherdev/tether/admission/strictjson"
)

// FileName is the log's name in the state directory.
const FileName = "audit.jsonl"

// Kinds of record: the closed set.
const (
	KindHandoverBegin = "handover_begin"
	KindHandoverEnd   = "handover_end"
	KindPause         = "pause"
	KindResume        = "resume"
	KindTokenMint     = "token_mint"
	KindTokenRevoke   = "token_revoke"
	// KindViewerOpen and KindViewerClose: a page opened the live view
	// with a token (its control WebSocket), and that viewer closed.
	KindViewerOpen  = "viewer_open"
	KindViewerClose = "viewer_close"
)

var kinds = map[string]bool{KindHandoverBegin: true, KindHandoverEnd: true, KindPause: true,
	KindResume: true, KindTokenMint: true, KindTokenRevoke: true, KindViewerOpen: true, KindViewerClose: true}

// Bounds.
const (
	maxLine  = 4096
	maxField = 256
)

// Genesis is the prev of the first record.
var Genesis = strings.Repeat("0", 64)

// Errors callers branch on.
var (
	// ErrRecord: a record to append is outside the schema.
	ErrRecord = errors.New("audit record invalid")
	// ErrChain: a line does not parse, breaks the chain (prev or seq), or
	// the log ends in a partial line.
	ErrChain = errors.New("audit log chain broken")
	// ErrCheckpoint: the log does not contain an expected earlier head.
	ErrCheckpoint = errors.New("audit log does not match the checkpoint")
)

// ChainError names the line and the check it failed.
type ChainError struct {
	Line   int
	Reason string
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("%v: line %d: %s", ErrChain, e.Line, e.Reason)
}

func (e *ChainError) Unwrap() error { return ErrChain }

// Record is one line. Seq and Prev are set by Append. Durations are in
// milliseconds.
type Record struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"`
	Actor     string    `json:"actor"`
	Role      string    `json:"role,omitempty"`
	Token     string    `json:"token,omitempty"`
	Scope     string    `json:"scope,omitempty"`
	TTLMillis int64     `json:"ttl_ms,omitempty"`
	DurMillis int64     `json:"duration_ms,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Prev      string    `json:"prev"`
}

// validate checks the closed schema's bounds.
func (r Record) validate() error {
	if !kinds[r.Kind] {
		return fmt.Errorf("%w: kind %q", ErrRecord, r.Kind)
	}
	if r.Actor == "" {
		return fmt.Errorf("%w: actor missing", ErrRecord)
	}
	for _, f := range []string{r.Actor, r.Role, r.Token, r.Scope, r.Reason} {
		if len(f) > maxField || strings.IndexFunc(f, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
			return fmt.Errorf("%w: field %q is not at most %d printable characters", ErrRecord, f, maxField)
		}
	}
	if r.TTLMillis < 0 || r.DurMillis < 0 || r.Time.IsZero() {
		return fmt.Errorf("%w: negative duration or missing time", ErrRecord)
	}
	return nil
}

// Hash is the hex SHA-256 of a line without its newline.
func Hash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// decodeLine parses one line strictly: unknown fields, trailing data and
// values outside the schema are refused.
func decodeLine(line []byte) (Record, error) {
	var r Record
	if err := strictjson.Decode(line, maxLine, &r); err != nil {
		return r, err
	}
	if len(r.Prev) != 64 {
		return r, errors.New("prev is not a SHA-256")
	}
	return r, r.validate()
}

// encodeLine is the canonical line of r (encoding/json's field order).
func encodeLine(r Record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(b) > maxLine {
		return nil, fmt.Errorf("%w: line of %d bytes", ErrRecord, len(b))
	}
	return b, nil
}
