// Package opstore is the custodian's operation-key store: the durable
// record that a keyed request was dispatched, and the receipt of what came
// of it.
//
// One durable write is spent before a keyed request reaches the receiver:
// an fdatasync'd append to an intent log beside a bbolt database. Results
// and receipts are written to bbolt behind the request (group-committed),
// so a crash can lose a result but never a dispatch: on the next Open every
// dispatched key without a result becomes Interrupted, and it is never
// dispatched again.
package opstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Outcome is the closed set of what a receipt says about its request.
type Outcome string

// The outcomes. Pending is the only non-final one: an exec that started
// and whose exit has not been observed yet.
const (
	// Verified: every requested relative file matched its expected SHA-256
	// (for a write, the written file's digest equals the content's).
	Verified Outcome = "verified"
	// NeedsReview: the request succeeded (exit 0, or the receiver
	// acknowledged) but nothing was verified by digest.
	NeedsReview Outcome = "needs_review"
	// Failed: the receiver refused, the child exited non-zero or by signal,
	// or a file did not match its expected digest.
	Failed Outcome = "failed"
	// Interrupted: the request was dispatched and its result is unknown
	// (custodian crash or transport loss). It is never dispatched again.
	Interrupted Outcome = "interrupted"
	// Pending: an exec started and its exit has not been observed.
	Pending Outcome = "pending"
)

// Final reports whether o can no longer change.
func (o Outcome) Final() bool {
	switch o {
	case Verified, NeedsReview, Failed, Interrupted:
		return true
	}
	return false
}

// Valid reports whether o is a member of the closed set (the four final
// outcomes, Pending, or the store's Dispatched state).
func (o Outcome) Valid() bool { return o.Final() || o == Pending || o == Dispatched }

// FileCheck is one file an exec asked to verify: its path relative to the
// grant root, the digest the caller expected and the digest the receiver
// computed after the child exited ("" when missing or not a regular file).
type FileCheck struct {
	Path     string `json:"path"`
	Expected string `json:"expected_sha256"`
	Actual   string `json:"actual_sha256"`
}

// ResultError is the refusal a request got, as returned to the agent: a
// tether code (receiver/wire's closed set) and a message naming the failed
// check.
type ResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CodeInterrupted is the tether code of an Interrupted receipt's error
// (admission/errcode.CodeInterrupted).
const CodeInterrupted = "interrupted"

// Receipt is the durable account of one keyed request. Response is the
// exact ACP result returned to the agent (replayed byte for byte on a retry
// with the same key and digest); Error is the refusal returned instead.
// What a retry must be answered with is kept in it: a read's Response
// holds the content read, a finished exec's Output its final output; the
// audit log keeps only their digests and sizes.
type Receipt struct {
	OpKey         string          `json:"op_key"`
	RequestSHA256 string          `json:"request_sha256"`
	Method        string          `json:"method"`
	SessionID     string          `json:"session_id"`
	TupleSHA256   string          `json:"tuple_sha256"`
	Principal     string          `json:"principal"`
	LeaseNotAfter time.Time       `json:"lease_not_after"`
	DispatchedAt  time.Time       `json:"dispatched_at"`
	CompletedAt   *time.Time      `json:"completed_at,omitempty"`
	RetainUntil   time.Time       `json:"retain_until"`
	Outcome       Outcome         `json:"outcome"`
	Response      json.RawMessage `json:"response,omitempty"`
	Error         *ResultError    `json:"error,omitempty"`
	TerminalID    string          `json:"terminal_id,omitempty"`
	Files         []FileCheck     `json:"files,omitempty"`
	Note          string          `json:"note,omitempty"`
	TaggedBy      string          `json:"tagged_by,omitempty"` // "custodian": the key was minted for a plain agent

	// Exit is how the child ended, converted from the receiver's answer
	// at the custodian's boundary.
	Exit *ExitStatus `json:"exit,omitempty"`
	// Output is an exec's final output as terminal/output answered it,
	// kept so a retry of its terminal/create is answered from the receipt
	// (terminal/output and wait_for_exit on the replayed terminal). nil
	// when the output was never observed, or did not fit (Note says so).
	Output *ExecOutput `json:"output,omitempty"`

	// Exec is what an exec (terminal/create) ran, as its request digest
	// covers it: what a routine saved from this receipt re-runs.
	Exec *ExecRequest `json:"exec,omitempty"`
}

// ExecRequest is what an exec ran: argv as exec'd, the cwd relative to
// the tuple's root, and the env the request merged over the computer's
// default environment.
type ExecRequest struct {
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd"`
	Env  map[string]string `json:"env,omitempty"`
}

// MaxExecBytes bounds what a receipt keeps of an exec's request: an
// ExecRequest that is not Small is not kept (a routine cannot be saved
// from that receipt).
const MaxExecBytes = 64 << 10

// Small reports whether e, JSON-encoded, surely stays within MaxExecBytes:
// every byte of its strings counts six (the longest JSON escape), plus
// the quotes and separators of each.
func (e *ExecRequest) Small() bool {
	n := 6*len(e.Cwd) + 64
	for _, a := range e.Argv {
		n += 6*len(a) + 3
	}
	for k, v := range e.Env {
		n += 6*(len(k)+len(v)) + 6
	}
	return n <= MaxExecBytes
}

// ExitStatus is how an exec's child ended: its exit code, or the signal
// that ended it. It is the receipt's own type, so a change of the wire
// protocol cannot change what a stored receipt means; its JSON is field
// for field that of the receiver's exit status (receiver/wire.ExitStatus),
// so receipts stored before it decode and replay unchanged. The custodian
// converts between the two.
type ExitStatus struct {
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// ExecOutput is an exec's final output, as terminal/output answered it.
type ExecOutput struct {
	Output    string `json:"output"`
	Truncated bool   `json:"truncated"`
}

// Fits reports whether r's stored form is within the bound every store
// keeps for a receipt (what Unmarshal accepts back), with room left for
// the identity fields a store stamps on it when it records it. A receipt
// whose response and output are clearly small is not encoded to tell.
func (r *Receipt) Fits() bool {
	if len(r.Response) <= maxRecordBytes/4 && (r.Output == nil || 6*len(r.Output.Output) <= maxRecordBytes/4) &&
		len(r.Files) <= 1024 && len(r.Note) <= 4<<10 && (r.Error == nil || len(r.Error.Message) <= 4<<10) &&
		(r.Exec == nil || r.Exec.Small()) {
		return true // a quarter each, the rest bounded by the checks on them: well within
	}
	b, err := r.Marshal()
	return err == nil && len(b)+stampRoom <= maxRecordBytes
}

// ResponseNeverFits reports whether an ACP result of n bytes (compact
// JSON) is too long for any receipt to keep, whatever else it holds: the
// caller need not encode it to ask Fits.
func ResponseNeverFits(n int64) bool { return n > maxRecordBytes }

// stampRoom is what Fits leaves for the fields Finish copies from the
// intent (op key, digests, session id, principal, times; each bounded).
const stampRoom = 8 << 10

// HasResult reports whether the receiver's answer (or a refusal standing
// in for it) is recorded: a retry is then answered from the receipt.
func (r *Receipt) HasResult() bool {
	return r.Response != nil || r.Error != nil || r.Outcome == Interrupted
}

// Marshal returns the receipt's stored bytes.
func (r *Receipt) Marshal() ([]byte, error) { return json.Marshal(r) }

// maxRecordBytes bounds a stored receipt or binding record: they hold
// digests and sizes, never contents (etcd's own request limit is 1.5 MiB).
const maxRecordBytes = 1 << 20

// Unmarshal decodes stored receipt bytes strictly and checks the outcome.
func Unmarshal(data []byte) (*Receipt, error) {
	var r Receipt
	if err := strictjson.Decode(data, maxRecordBytes, &r); err != nil {
		return nil, fmt.Errorf("%w: receipt: %w", ErrCorrupt, err)
	}
	if !r.Outcome.Valid() {
		return nil, fmt.Errorf("%w: receipt %q: outcome %q not in the closed set", ErrCorrupt, r.OpKey, r.Outcome)
	}
	return &r, nil
}

// interrupted returns the receipt an intent becomes when its result was
// never recorded.
func interrupted(in Intent, now time.Time, note string) *Receipt {
	return &Receipt{
		OpKey: in.OpKey, RequestSHA256: in.RequestSHA256, Method: in.Method,
		SessionID: in.SessionID, TupleSHA256: in.TupleSHA256, Principal: in.Principal,
		LeaseNotAfter: in.LeaseNotAfter, DispatchedAt: in.DispatchedAt,
		CompletedAt: &now, RetainUntil: in.RetainUntil, Outcome: Interrupted,
		Error: &ResultError{Code: CodeInterrupted, Message: fmt.Sprintf(
			"op key %s was dispatched and its result is unknown (%s); it is never replayed", in.OpKey, note)},
		Note: note, TaggedBy: in.TaggedBy,
	}
}

// interruptPending turns r, an exec whose exit was never observed, into
// Interrupted: its Response (the terminal id) stays as it was answered, and
// its Error is what a retry of its key is answered with instead.
func interruptPending(r *Receipt, now time.Time, note string) {
	r.Outcome, r.Note, r.CompletedAt = Interrupted, note, &now
	r.Error = &ResultError{Code: CodeInterrupted, Message: fmt.Sprintf(
		"op key %s started a command whose exit is unknown (%s); it is never run again", r.OpKey, note)}
}
