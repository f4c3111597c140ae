// Package errcode is the closed set of tether error codes, the contract
// every room shares: the receiver answers with them on the wire, the
// custodian carries them in ACP errors, the plugin and the host library
// branch on them. It is a leaf: it imports only the standard library, so
// importing it links nothing else of tether.
//
// It is named errcode, not code, because code is the natural name of a
// local variable holding one (code, ok := acperr.CodeOf(err)).
package errcode

import "fmt"

// Code is one member of the closed set of tether error codes. The same
// codes travel in receiver responses and, as data {"tether": CODE}, in the
// JSON-RPC errors the custodian returns over ACP. Callers branch on Code,
// never on message text.
type Code string

// The closed set. docs/protocol.md explains each one; adding a code means
// adding it here, to Codes, and to that page.
const (
	CodeTupleMismatch Code = "tuple_mismatch" // request digest differs from the binding's tuple
	CodeNotAdmitted   Code = "not_admitted"   // no binding, or no grant covers the tuple
	CodeLeaseExpired  Code = "lease_expired"  // the lease or grant has passed not_after
	CodeFenced        Code = "fenced"         // binding fenced until an explicit reattach
	CodeFateUnknown   Code = "fate_unknown"   // transport lost with the request in flight
	CodePathEscape    Code = "path_escape"    // path resolves outside the grant root
	CodeOpKeyConflict Code = "op_key_conflict"
	CodeDenied        Code = "denied"      // op not allowed by the grant or the receiver
	CodeTooLarge      Code = "too_large"   // a size bound of the grant or protocol, or of the custodian's long messages
	CodeInterrupted   Code = "interrupted" // op key dispatched before a crash; never replayed
	CodeNotFound      Code = "not_found"   // file or terminal does not exist
	CodeInvalid       Code = "invalid"     // malformed arguments
	CodePrecondition  Code = "precondition_failed"
	CodeBusy          Code = "busy"        // the file is leased in the computer, or the custodian's long-message caps are taken; retry later
	CodeTimeout       Code = "timeout"     // deadline reached
	CodeUnavailable   Code = "unavailable" // receiver shutting down or not reachable
	CodeInternal      Code = "internal"
)

// Codes lists every member of the closed set, in documentation order.
var Codes = []Code{
	CodeTupleMismatch, CodeNotAdmitted, CodeLeaseExpired, CodeFenced,
	CodeFateUnknown, CodePathEscape, CodeOpKeyConflict, CodeDenied,
	CodeTooLarge, CodeInterrupted, CodeNotFound, CodeInvalid,
	CodePrecondition, CodeBusy, CodeTimeout, CodeUnavailable, CodeInternal,
}

// Valid reports whether c is a member of the closed set.
func (c Code) Valid() bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// Error is a failure that carries its Code. Message names the failed check.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Is lets errors.Is match any *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
