package contract

import (
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
)

// The session types of the contract: what OpenSession and Status answer
// and ToolPolicy asks. plugin/binding keeps the table that produces them.

// State is a session's binding state.
type State int

// The states. The zero value is never used.
const (
	// Unbound: the session never asked to bind; the host keeps its tools.
	Unbound State = iota + 1
	// Pending: the session asked to bind; no bind has succeeded yet.
	Pending
	// Bound: tuple pinned, attached on one connection, lease current.
	Bound
	// Fenced: was bound; refused until an explicit reattach.
	Fenced
)

func (s State) String() string {
	switch s {
	case Unbound:
		return "unbound"
	case Pending:
		return "pending"
	case Bound:
		return "bound"
	case Fenced:
		return "fenced"
	}
	return "invalid"
}

// Method is the ACP method that opened a session.
type Method int

// The two methods that may carry `_meta["tether/bind"]`.
const (
	MethodNew Method = iota + 1
	MethodLoad
)

// Status is a snapshot of one session.
type Status struct {
	SessionID       string
	Principal       string // who opened the session
	State           State
	Tuple           admission.Tuple // zero unless a tuple is pinned
	TupleSHA256     string
	LeaseNotAfter   time.Time
	GrantGeneration uint64
	// Code and Message describe the last refusal or fence.
	Code    errcode.Code
	Message string
}

// HostToolKind classifies a host agent's own tool.
type HostToolKind int

// The kinds. Anything else is refused.
const (
	HostFilesystem HostToolKind = iota + 1
	HostProcess
	HostOther
)
