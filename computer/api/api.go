// Package api is the contract of the computer service (tether-computer):
// the JSON bodies of its HTTP API, the closed set of error codes, and
// Backend, the Go interface the HTTP server calls and the service
// implements. It is a leaf: it imports only the standard library,
// admission's leaf and egress/policy (a leaf), so a client links the
// contract without the daemon.
// The OpenAPI 3 document that describes the same bodies is served at
// /v1/openapi.json and lives beside this file.
package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/egress/policy"
)

// States of a computer; the transitions between them are decided in one
// place, computer/lifecycle.
const (
	StateQueued    = "queued"
	StateCreating  = "creating"
	StateRunning   = "running"
	StateSuspended = "suspended"
	StateExpiring  = "expiring"
	StateDeleted   = "deleted"
	StateFailed    = "failed"
)

// Tiers of computer.
const (
	TierNamespaced = "namespaced"
	TierVM         = "vm"
)

// Limits are what a create asks of one computer. Zero means the
// service's default; each has a floor and a ceiling the service checks.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
}

// CreateRequest is the body of POST /v1/computers.
type CreateRequest struct {
	Limits Limits `json:"limits,omitempty"`
	// Tier is TierNamespaced (the default, also when empty) or TierVM.
	Tier string `json:"tier,omitempty"`
	// LeaseTTLSeconds is the lease; zero means the service default, more
	// than the service maximum is refused (bad_request).
	LeaseTTLSeconds int64 `json:"lease_ttl_s,omitempty"`
	// IdleTimeoutSeconds suspends the computer after this long with no
	// callback and no running command; zero means the default (900).
	IdleTimeoutSeconds int64             `json:"idle_timeout_s,omitempty"`
	Labels             map[string]string `json:"labels,omitempty"`
	// QueueTimeoutSeconds bounds the wait in the queue when the host is
	// at capacity; zero means the service default.
	QueueTimeoutSeconds int64 `json:"queue_timeout_s,omitempty"`
	// Egress is the computer's egress policy; absent (the zero Policy)
	// denies all. A policy that allows anything needs a service that
	// gives egress (no_egress otherwise); a preset name the operator has
	// not configured is refused (unknown_preset).
	Egress policy.Policy `json:"egress,omitzero"`
	// Screen gives the computer a display and a live view whose links
	// its owner mints (POST /v1/computers/{id}/links). Only a TierVM
	// computer has one; asked of another tier it is refused
	// (bad_request) and nothing is made.
	Screen bool `json:"screen,omitempty"`
}

// EgressInfo is the body of GET and the answer of PUT
// /v1/computers/{id}/egress (whose body is a policy.Policy).
type EgressInfo struct {
	Computer string        `json:"computer"`
	Policy   policy.Policy `json:"policy"`
	// Enabled says the service gives computers egress at all; without it
	// a computer has its loopback only, and its policy is deny all.
	Enabled bool `json:"enabled"`
	// Attached says the host's egress proxy serves the computer now
	// (false while it is queued or after it ended).
	Attached bool `json:"attached"`
	// RefusalLog is the file inside the computer where the proxy's
	// refusals show, one line each; empty while it is not attached or
	// where the machine has none.
	RefusalLog string `json:"refusal_log,omitempty"`
}

// RenewRequest is the body of POST /v1/computers/{id}/renew.
type RenewRequest struct {
	LeaseTTLSeconds int64 `json:"lease_ttl_s"`
}

// Computer is what the service says about one computer.
type Computer struct {
	ID     string `json:"id"`
	Owner  string `json:"owner"`
	State  string `json:"state"`
	Tier   string `json:"tier"`
	Limits Limits `json:"limits"`
	// Tuple is the allocation tuple the computer's grant admits; empty
	// until the computer is running.
	Tuple              *admission.Tuple  `json:"tuple,omitempty"`
	Labels             map[string]string `json:"labels,omitempty"`
	CreatedAt          time.Time         `json:"created_at"`
	LeaseExpiresAt     time.Time         `json:"lease_expires_at,omitzero"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_s"`
	// CustodianConfig is the path of the custodian configuration that
	// reaches this computer's receiver (readable by the owner's group).
	CustodianConfig string `json:"custodian_config,omitempty"`
	// FromPool says the computer was claimed from the warm pool.
	FromPool bool `json:"from_pool,omitempty"`
	// Reason says why a failed or deleted computer ended.
	Reason string `json:"reason,omitempty"`
	// Records is, once the computer has ended, the directory that keeps
	// its custody records: the custodian's state (receipts, audit log)
	// and audit.pub, for tether-custodian receipts show and audit verify.
	Records string `json:"records,omitempty"`
	// Accelerator is "kvm" or "tcg" on a VM computer.
	Accelerator string `json:"accelerator,omitempty"`
	// Transport is a VM computer's link to its receiver and why it was
	// chosen (api.MachineInfo.Transport).
	Transport string `json:"transport,omitempty"`
	// Screen says the computer has a display and a live view.
	Screen bool `json:"screen,omitempty"`
}

// ComputerList is the body of GET /v1/computers.
type ComputerList struct {
	Computers []Computer `json:"computers"`
}

// Event is one state change, as sent on GET /v1/events (Server-Sent
// Events, one JSON event per "data:" line).
type Event struct {
	Seq      uint64    `json:"seq"`
	Computer string    `json:"computer"`
	Owner    string    `json:"owner"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason,omitempty"`
	// QueuePosition is set on queued events: 1 is next.
	QueuePosition int `json:"queue_position,omitempty"`
}

// Receipt operations.
const (
	OpExport  = "export"
	OpImport  = "import"
	OpCopyIn  = "copy_in"
	OpCopyOut = "copy_out"
)

// ReceiptList is the body of GET /v1/computers/{id}/receipts.
type ReceiptList struct {
	Receipts []Receipt `json:"receipts"`
}

// Receipt says what one export, import or copy moved. The service keeps
// every receipt it issues (computer/service: the receipts bucket of its
// store).
type Receipt struct {
	Computer string `json:"computer"`
	Op       string `json:"op"`
	// Path is the path in the computer a copy named.
	Path string `json:"path,omitempty"`
	// SHA256 is the lowercase hex SHA-256 of the stream: the tar.zst
	// bytes of an export or import, the tar bytes of a copy.
	SHA256 string `json:"sha256"`
	// Bytes is the length of that stream.
	Bytes int64 `json:"bytes"`
	// Files counts the regular files, directories and symlinks moved.
	Files int64 `json:"files"`
	// Skipped counts what an export or copy out left out (sockets,
	// fifos, devices).
	Skipped int64     `json:"skipped,omitempty"`
	At      time.Time `json:"at"`
}

// HeaderSHA256 is the response header that carries the SHA-256 (lowercase
// hex) of an export's or a copy out's body; the body is spooled whole
// first, so the header and Content-Length are known before it is sent.
const HeaderSHA256 = "X-Tether-SHA256"

// ImportResult is the answer of POST /v1/computers/import.
type ImportResult struct {
	Computer Computer `json:"computer"`
	Receipt  Receipt  `json:"receipt"`
}

// Caller is who makes a request, taken from the credential (token or
// peer credentials), never from the request body.
type Caller struct {
	Owner string
	Admin bool
}

// Error codes: the closed set every 4xx and 5xx answer carries.
const (
	CodeBadRequest   = "bad_request"   // malformed, unknown field, out of range
	CodeTooLarge     = "too_large"     // body over the limit
	CodeUnauthorized = "unauthorized"  // no or unknown credential
	CodeNotFound     = "not_found"     // no such computer for this caller
	CodeConflict     = "conflict"      // the computer's state forbids it
	CodeQueueTimeout = "queue_timeout" // waited in the queue too long
	CodeOverQuota    = "over_quota"    // the owner's quota is spent
	CodeUnavailable  = "unavailable"   // the service is shutting down
	CodeInternal     = "internal"      // anything else; logged
	// CodeUnknownPreset: an egress policy names a preset the operator's
	// egress configuration does not hold.
	CodeUnknownPreset = "unknown_preset"
	// CodeNoEgress: an egress policy that allows something, asked of a
	// service that gives no egress.
	CodeNoEgress = "no_egress"
)

// Error is the body of every error answer, and the error Backend
// methods return so the server can choose the status.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Errorf makes an *Error with code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns err's code, CodeInternal when it carries none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// Backend is what the HTTP server calls; computer/service implements
// it. Every method takes the caller from the server, and answers
// not_found for a computer the caller may not see (an admin sees all).
type Backend interface {
	// Create returns once the computer is running, or fails. While the
	// host is at capacity the request waits in the queue; cancelling ctx
	// (the client went away) drops it from the queue.
	Create(ctx context.Context, c Caller, req CreateRequest) (Computer, error)
	Get(ctx context.Context, c Caller, id string) (Computer, error)
	List(ctx context.Context, c Caller) ([]Computer, error)
	// Delete withdraws the grant, kills what runs, and tears down.
	Delete(ctx context.Context, c Caller, id string) error
	Renew(ctx context.Context, c Caller, id string, ttl time.Duration) (Computer, error)
	Suspend(ctx context.Context, c Caller, id string) (Computer, error)
	Resume(ctx context.Context, c Caller, id string) (Computer, error)
	// Receipts lists the receipts of the computer's exports, imports and
	// copies, oldest first; an ended computer's stay readable.
	Receipts(ctx context.Context, c Caller, id string) ([]Receipt, error)
	// Events streams state changes the caller may see, until ctx ends;
	// the channel is closed then.
	Events(ctx context.Context, c Caller) (<-chan Event, error)
	// TouchAs records activity on a running computer, resuming it first
	// when it is suspended.
	TouchAs(ctx context.Context, c Caller, id string) (Computer, error)
	// Export returns the root of a suspended computer as a tar.zst
	// stream, complete before it returns, with its receipt
	// (Receipt.Bytes is its length). The caller closes the stream.
	Export(ctx context.Context, c Caller, id string) (io.ReadCloser, Receipt, error)
	// Import reads the tar.zst stream r to its end, checks its SHA-256
	// is sha256 (nothing is created when it is not), then creates a
	// computer as Create does whose root is the stream's tree.
	Import(ctx context.Context, c Caller, req CreateRequest, r io.Reader, sha256 string) (ImportResult, error)
	// CopyIn extracts the tar stream r beneath the directory dir of the
	// computer's root; every top name of the stream must be new there.
	CopyIn(ctx context.Context, c Caller, id, dir string, r io.Reader) (Receipt, error)
	// CopyOut returns path of the computer's root as a tar stream whose
	// one top entry is path's last element, complete before it returns,
	// with its receipt. The caller closes the stream.
	CopyOut(ctx context.Context, c Caller, id, path string) (io.ReadCloser, Receipt, error)
	// Egress returns the computer's egress policy.
	Egress(ctx context.Context, c Caller, id string) (EgressInfo, error)
	// SetEgress replaces the egress policy of a running or suspended
	// computer and returns what is stored: new connections see it at
	// once, open tunnels it no longer allows close within a second.
	SetEgress(ctx context.Context, c Caller, id string, pol policy.Policy) (EgressInfo, error)
	// Link mints a one-time link to the live view of a running computer
	// with a screen, for its owner (or an admin): not_found for anyone
	// else, conflict when it has no screen or is not running.
	Link(ctx context.Context, c Caller, id string, req LinkRequest) (Link, error)
}
