// Package binding is the plugin's session table: which ACP session asked to
// bind, to which tuple, on which connection, until when, and whether it is
// fenced. It enforces binding rules 1-7 (SECURITY.md "Plugin: binding
// rules"); it performs no I/O except the `_tether/attach` call it is handed.
package binding

import (
	"context"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// AttachFunc calls `_tether/attach` for sessionID on the connection that
// asked to bind, and returns the client's confirmation.
type AttachFunc func(ctx context.Context, sessionID, tupleSHA256 string) (leaseNotAfter time.Time, grantGeneration uint64, err error)

// Grant is what a tool may act on: valid for one epoch of one binding.
type Grant struct {
	SessionID   string
	Tuple       admission.Tuple
	TupleSHA256 string
	NotAfter    time.Time
	Epoch       uint64
}

// session is one row. Guarded by Table.mu, except that open serializes
// OpenSession calls on one session (the attach call runs without Table.mu).
type session struct {
	open sync.Mutex

	id        string
	principal string // who opened it first; nobody else may touch it
	conn      string // the connection it lives on

	intent   bool             // asked to bind, ever (sticky)
	tuple    *admission.Tuple // pinned by the first well-formed bind request
	attached bool             // a bind succeeded on conn and was not fenced since
	fenced   bool
	bound    bool // ever bound: a failed reattach fences instead of pending

	leaseMeta  time.Time // lease_not_after of the latest accepted bind meta
	notAfter   time.Time // min(leaseMeta, attach's lease_not_after)
	generation uint64
	epoch      uint64 // bumps on every attach and every fence
	code       errcode.Code
	message    string
}

func (s *session) state() contract.State {
	switch {
	case !s.intent:
		return contract.Unbound
	case s.fenced:
		return contract.Fenced
	case s.attached:
		return contract.Bound
	}
	return contract.Pending
}

func (s *session) status() contract.Status {
	st := contract.Status{SessionID: s.id, Principal: s.principal, State: s.state(), LeaseNotAfter: s.notAfter,
		GrantGeneration: s.generation, Code: s.code, Message: s.message}
	if s.tuple != nil {
		st.Tuple = *s.tuple
		st.TupleSHA256 = s.tuple.SHA256()
	}
	return st
}

// Table is the plugin's session table. The zero value is not usable; call
// New. All methods are safe for concurrent use.
type Table struct {
	mu       sync.Mutex
	sessions map[string]*session
	now      func() time.Time
}

// New returns an empty table that reads time from now (time.Now if nil).
func New(now func() time.Time) *Table {
	if now == nil {
		now = time.Now
	}
	return &Table{sessions: make(map[string]*session), now: now}
}

// refuse builds the error every refusal returns: a *errcode.Error naming the
// failed check.
func refuse(code errcode.Code, format string, args ...any) error {
	return errcode.Errorf(code, format, args...)
}

func (t *Table) snapshot(s *session) contract.Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.status()
}

// Status returns the session's snapshot to principal, the one that opened
// it; an unknown session is not_admitted, another principal's is denied
// (rule 5) and left untouched. A bound session whose lease has passed is
// fenced first (lease_expired, the fence Authorize applies), so Status never
// reports Bound for a lease that has ended.
func (t *Table) Status(principal, sessionID string) (contract.Status, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[sessionID]
	switch {
	case !ok:
		return contract.Status{}, refuse(errcode.CodeNotAdmitted, "session %q is unknown to the plugin", sessionID)
	case s.principal != principal:
		return contract.Status{}, refuse(errcode.CodeDenied, "session %q belongs to another principal", sessionID)
	}
	_ = t.expireLocked(s) // the refusal is in the snapshot's code and message
	return s.status(), nil
}

// expireLocked fences s (rule 6) if it is attached and its lease has
// passed, and returns the lease_expired refusal; nil if s is not attached
// or its lease is current. Callers hold t.mu.
func (t *Table) expireLocked(s *session) error {
	if !s.attached || t.now().Before(s.notAfter) {
		return nil
	}
	msg := "lease ended at " + rfc3339(s.notAfter)
	t.fenceLocked(s, errcode.CodeLeaseExpired, msg)
	return refuse(errcode.CodeLeaseExpired, "session %q: %s", s.id, msg)
}
