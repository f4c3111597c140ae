// Package lifecycle is the one place that decides which state changes a
// computer may make (this file), and the hash-chained log every change is
// written to (log.go). The service (computer/service) asks Check before
// each transition and appends the transition to the Log before it acts.
package lifecycle

import (
	"errors"
	"fmt"

	"github.com/tetherdev/tether/computer/api"
)

// None is the state before a computer's first record: the only transition
// out of it is to queued.
const None = ""

// ErrIllegal is the failed check of every refused transition.
var ErrIllegal = errors.New("illegal transition")

// ErrUnknownState is a state not in the closed set of computer/api.
var ErrUnknownState = errors.New("unknown state")

// allowed is the whole state machine: for each state, the states it may
// go to. Why each edge exists:
//
//   - queued → creating: the queue admitted the request.
//   - queued → deleted: the request left the queue (timeout, the client
//     went away, a delete, a restart); nothing was made.
//   - creating → running: made and granted.
//   - creating → expiring: deleted or expired while being made, or the
//     daemon restarted mid-way; the teardown follows.
//   - creating → failed: making it failed and what was made is destroyed.
//   - running ↔ suspended: idle (freezer) and resume.
//   - running, suspended → expiring: the lease ended, a delete, or the
//     receiver died; the grant is withdrawn first.
//   - expiring → deleted: torn down in order; expiring → failed: a step
//     of the teardown failed, or the receiver had died, and the machine
//     was destroyed.
//
// deleted and failed are final.
var allowed = map[string][]string{
	None:               {api.StateQueued},
	api.StateQueued:    {api.StateCreating, api.StateDeleted},
	api.StateCreating:  {api.StateRunning, api.StateExpiring, api.StateFailed},
	api.StateRunning:   {api.StateSuspended, api.StateExpiring},
	api.StateSuspended: {api.StateRunning, api.StateExpiring},
	api.StateExpiring:  {api.StateDeleted, api.StateFailed},
	api.StateDeleted:   {},
	api.StateFailed:    {},
}

// States is the closed set of states, in the order of api.
var States = []string{api.StateQueued, api.StateCreating, api.StateRunning, api.StateSuspended,
	api.StateExpiring, api.StateDeleted, api.StateFailed}

// TransitionError names a refused transition.
type TransitionError struct {
	From, To string
	Err      error // ErrIllegal or ErrUnknownState
}

func (e *TransitionError) Error() string {
	from := e.From
	if from == None {
		from = "(none)"
	}
	return fmt.Sprintf("lifecycle: %s → %s: %v", from, e.To, e.Err)
}

func (e *TransitionError) Unwrap() error { return e.Err }

// Check returns nil when a computer in state from may go to state to, and
// a *TransitionError naming both otherwise.
func Check(from, to string) error {
	next, ok := allowed[from]
	if !ok {
		return &TransitionError{From: from, To: to, Err: ErrUnknownState}
	}
	if _, ok := allowed[to]; !ok || to == None {
		return &TransitionError{From: from, To: to, Err: ErrUnknownState}
	}
	for _, n := range next {
		if n == to {
			return nil
		}
	}
	return &TransitionError{From: from, To: to, Err: ErrIllegal}
}

// Final says whether state is one no transition leaves.
func Final(state string) bool {
	next, ok := allowed[state]
	return ok && state != None && len(next) == 0
}

// Known says whether state is one of the closed set (None excluded).
func Known(state string) bool {
	_, ok := allowed[state]
	return ok && state != None
}
