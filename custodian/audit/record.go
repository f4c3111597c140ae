// Package audit is the custodian's transparency log: every binding,
// attach, refusal, dispatch, result, cancel and fence is appended as one
// record, hashed into a Merkle tree with golang.org/x/mod/sumdb/tlog, and
// covered by checkpoints signed in the signed-note format
// (golang.org/x/mod/sumdb/note). Records hold digests and sizes only,
// never file contents or command output.
//
// Appends are group-committed by a background writer (one fdatasync per
// batch), off the request path, in exactly the order Append was called.
package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Kind is the closed set of audited events.
type Kind string

// The audited events.
const (
	KindBind     Kind = "bind"     // a session was bound to a tuple
	KindAttach   Kind = "attach"   // an attach was confirmed by the receiver (a refused one is counted in refusals)
	KindRefusal  Kind = "refusal"  // one refusal (logs written before refusals were aggregated)
	KindDispatch Kind = "dispatch" // a request was sent to the receiver
	KindResult   Kind = "result"   // the receiver's answer (or its loss)
	KindCancel   Kind = "cancel"   // a cancel or kill was sent for a running child
	KindFence    Kind = "fence"    // a binding was fenced until reattach
	KindLease    Kind = "lease"    // a binding's lease was extended
	KindAgent    Kind = "agent"    // the agent process was started: jailed, or unjailed by --no-jail
	// KindPermission: the agent's session/request_permission and its
	// answer (the selected option's kind, or "cancelled", as Outcome).
	KindPermission Kind = "permission"
	// KindRefusals: the callbacks of one session (or, without a session
	// id, of sessions not bound on one ACP connection) refused before
	// anything was sent, since that session's previous refusals record:
	// per code, a count and the first and last (Refusals).
	KindRefusals Kind = "refusals"
	// KindClaim: the custodian became the owner of a session in the
	// fleet's op store (FenceToken: its fencing token; Outcome "claimed",
	// or "taken_over" when an earlier owner left keys in flight, each
	// then recorded as a result with outcome interrupted, code takeover).
	KindClaim Kind = "claim"
	// KindFolded: the permission requests or attaches (Method) of one
	// session (or, without a session id, the permission requests of
	// sessions not bound on one ACP connection) past the custodian's
	// audit budget in one window: per outcome, how many there were and
	// the time of the first and last (Folded).
	KindFolded Kind = "folded"
	// KindRoutine: a routine was saved (Outcome "saved", OpKey the source
	// receipt's) or run (Outcome "run", OpKey the run's own); its
	// template's digest is Digests["template"] (custodian/routine).
	KindRoutine Kind = "routine"
)

var kinds = []Kind{KindBind, KindAttach, KindRefusal, KindDispatch, KindResult, KindCancel, KindFence, KindLease, KindAgent,
	KindPermission, KindRefusals, KindClaim, KindFolded, KindRoutine}

// Valid reports whether k is in the closed set.
func (k Kind) Valid() bool {
	for _, x := range kinds {
		if k == x {
			return true
		}
	}
	return false
}

// Record is one audited event. Seq is its index in the log, set by
// Append. Digests are lowercase hex SHA-256 keyed by what they cover
// ("content", "output", "path", "file:<path sha256>", ...); Sizes are byte
// counts keyed the same way. No field carries file contents, command
// output, paths or argv in clear.
type Record struct {
	Seq             int64             `json:"seq"`
	Time            time.Time         `json:"time"`
	Kind            Kind              `json:"kind"`
	SessionID       string            `json:"session_id,omitempty"`
	TupleSHA256     string            `json:"tuple_sha256,omitempty"`
	Principal       string            `json:"principal,omitempty"`
	Method          string            `json:"method,omitempty"`
	OpKey           string            `json:"op_key,omitempty"`
	TaggedBy        string            `json:"tagged_by,omitempty"` // "custodian": the op tag was minted for a plain agent
	RequestSHA256   string            `json:"request_sha256,omitempty"`
	Code            string            `json:"code,omitempty"`
	Outcome         string            `json:"outcome,omitempty"`
	GrantGeneration uint64            `json:"grant_generation,omitempty"`
	FenceToken      uint64            `json:"fence_token,omitempty"` // kind claim: the fleet's fencing token
	LeaseNotAfter   *time.Time        `json:"lease_not_after,omitempty"`
	ExitCode        *int              `json:"exit_code,omitempty"`
	Signal          string            `json:"signal,omitempty"`
	Digests         map[string]string `json:"digests,omitempty"`
	Sizes           map[string]int64  `json:"sizes,omitempty"`
	// Refusals (kind refusals) maps each code to its count and its first
	// and last refusal.
	Refusals map[string]RefusalCount `json:"refusals,omitempty"`
	// Folded (kind folded) maps each outcome to how many records were
	// folded and over what time.
	Folded map[string]FoldCount `json:"folded,omitempty"`
}

// FoldCount is how many records of one outcome were folded into one, and
// the time of the first and last of them.
type FoldCount struct {
	Count int64     `json:"count"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// RefusalCount is how often one code refused a session's callbacks, and
// the first and last of them.
type RefusalCount struct {
	Count int64        `json:"count"`
	First RefusalEvent `json:"first"`
	Last  RefusalEvent `json:"last"`
}

// RefusalEvent is one refused callback: when, which method, its op key
// (when its tag had a valid one) and who tagged it.
type RefusalEvent struct {
	Time     time.Time `json:"time"`
	Method   string    `json:"method,omitempty"`
	OpKey    string    `json:"op_key,omitempty"`
	TaggedBy string    `json:"tagged_by,omitempty"`
}

// MaxRecordBytes bounds one encoded record.
const MaxRecordBytes = 16 << 10

// ErrCorrupt is wrapped when the log or a record does not decode.
var ErrCorrupt = errors.New("audit log corrupt")

// encode returns the record's bytes as stored and hashed: compact JSON,
// which never contains a newline.
func (r *Record) encode() ([]byte, error) {
	if !r.Kind.Valid() {
		return nil, fmt.Errorf("audit: kind %q not in the closed set", r.Kind)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("audit: encode record: %w", err)
	}
	if len(data) > MaxRecordBytes {
		return nil, fmt.Errorf("audit: record of %d bytes exceeds %d", len(data), MaxRecordBytes)
	}
	return data, nil
}

// DecodeRecord strictly decodes one stored record.
func DecodeRecord(data []byte) (*Record, error) {
	var r Record
	if err := strictjson.Decode(data, MaxRecordBytes, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if !r.Kind.Valid() {
		return nil, fmt.Errorf("%w: kind %q not in the closed set", ErrCorrupt, r.Kind)
	}
	return &r, nil
}

// SplitLog splits the log file's bytes into records. complete is the
// length of the prefix made of newline-terminated records; a last line
// without its newline is a torn append and is not returned. An empty line
// is corruption.
func SplitLog(data []byte) (records [][]byte, complete int, err error) {
	off := 0
	for off < len(data) {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			break
		}
		if i == 0 {
			return records, off, fmt.Errorf("%w: empty line at offset %d", ErrCorrupt, off)
		}
		records = append(records, data[off:off+i])
		off += i + 1
	}
	return records, off, nil
}
