package binding

import (
	"context"
	"errors"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// OpenRequest reports one session/new or session/load.
type OpenRequest struct {
	ConnID    string
	SessionID string
	// Principal is the identity the host authenticated for the connection
	// (rule 1). It is never read from the bind meta.
	Principal string
	Method    contract.Method
	// Meta is the request's whole `_meta`; only acpmeta.KeyBind is read.
	Meta map[string]any
	// Attach confirms a bind with the client on ConnID.
	Attach AttachFunc
}

// Open records a session/new or session/load. Without `_meta["tether/bind"]`
// the session stays unbound, unless it asked to bind before (rule 2), in
// which case the load is refused and nothing changes. With it, the request
// must come from the tuple's owner (rules 1, 5), name the pinned tuple if
// one is pinned (rule 3), and be confirmed by `_tether/attach` on this
// connection (rule 4). Every refusal is a *errcode.Error naming the check.
func (t *Table) Open(ctx context.Context, req OpenRequest) (contract.Status, error) {
	if req.SessionID == "" || req.ConnID == "" {
		return contract.Status{}, refuse(errcode.CodeInvalid, "session id and connection id are required")
	}
	if req.Principal == "" {
		return contract.Status{}, refuse(errcode.CodeDenied, "connection %s has no authenticated principal", req.ConnID)
	}
	s, err := t.lookupOrCreate(req)
	if err != nil {
		return contract.Status{}, err
	}
	s.open.Lock()
	defer s.open.Unlock()

	bind, present, err := acpmeta.BindFromMeta(req.Meta)
	switch {
	case !present:
		return t.openUnbound(s, req)
	case err != nil:
		return t.refuseBind(s, errcode.CodeInvalid, "bind request malformed: %v", err)
	}
	if err := t.admit(s, req, bind); err != nil {
		return t.snapshot(s), err
	}
	lease, gen, aerr := req.Attach(ctx, s.id, bind.Tuple.SHA256())
	return t.finishAttach(s, req, bind, lease, gen, aerr)
}

// lookupOrCreate returns the session, refusing one that another principal
// opened first (rule 5: no state change on refusal).
func (t *Table) lookupOrCreate(req OpenRequest) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[req.SessionID]
	if !ok {
		s = &session{id: req.SessionID, principal: req.Principal, conn: req.ConnID}
		t.sessions[req.SessionID] = s
		return s, nil
	}
	if s.principal != req.Principal {
		return nil, refuse(errcode.CodeDenied, "session %q belongs to another principal; %q may not open it",
			req.SessionID, req.Principal)
	}
	if req.Method == contract.MethodNew {
		return nil, refuse(errcode.CodeInvalid, "session/new reused existing session id %q", req.SessionID)
	}
	return s, nil
}

// openUnbound handles a request without bind meta.
func (t *Table) openUnbound(s *session, req OpenRequest) (contract.Status, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.intent {
		return s.status(), refuse(errcode.CodeNotAdmitted,
			"session %q asked to bind (state %s); only a session/load carrying _meta[%q] can reattach it",
			s.id, s.state(), acpmeta.KeyBind)
	}
	s.conn = req.ConnID
	return s.status(), nil
}

// refuseBind records the sticky intent and refuses.
func (t *Table) refuseBind(s *session, code errcode.Code, format string, args ...any) (contract.Status, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.intent = true
	err := refuse(code, format, args...)
	s.code, s.message = code, err.(*errcode.Error).Message
	return s.status(), err
}

// admit runs every check that needs no peer: owner, tuple, lease. The
// intent is sticky from here whatever the outcome.
func (t *Table) admit(s *session, req OpenRequest, bind acpmeta.Bind) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.intent = true
	var err error
	switch {
	case bind.Tuple.Owner != req.Principal:
		err = refuse(errcode.CodeDenied, "principal %q is not the tuple owner %q", req.Principal, bind.Tuple.Owner)
	case s.tuple != nil && !s.tuple.Equal(bind.Tuple):
		err = refuse(errcode.CodeTupleMismatch, "tuple_sha256 %s differs from the pinned %s: the tuple is immutable",
			bind.Tuple.SHA256(), s.tuple.SHA256())
		t.fenceLocked(s, errcode.CodeTupleMismatch, err.(*errcode.Error).Message)
		return err
	case s.tuple != nil && bind.LeaseNotAfter.Before(s.leaseMeta):
		err = refuse(errcode.CodeInvalid, "lease_not_after %s is before the accepted %s: only a same-tuple extension is accepted",
			rfc3339(bind.LeaseNotAfter), rfc3339(s.leaseMeta))
	case !bind.LeaseNotAfter.After(t.now()):
		s.pin(bind.Tuple)
		err = refuse(errcode.CodeLeaseExpired, "lease_not_after %s has passed", rfc3339(bind.LeaseNotAfter))
	default:
		s.pin(bind.Tuple)
		return nil
	}
	s.code, s.message = err.(*errcode.Error).Code, err.(*errcode.Error).Message
	return err
}

func (s *session) pin(tu admission.Tuple) {
	if s.tuple == nil {
		s.tuple = &tu
	}
}

// finishAttach applies the client's answer to `_tether/attach`.
func (t *Table) finishAttach(s *session, req OpenRequest, bind acpmeta.Bind, lease time.Time, gen uint64, aerr error) (contract.Status, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var err error
	switch {
	case aerr != nil:
		code, ok := acperr.CodeOf(aerr)
		if !ok {
			code = errcode.CodeNotAdmitted
		}
		msg := aerr.Error()
		var we *errcode.Error
		if errors.As(aerr, &we) {
			msg = we.Message
		}
		err = refuse(code, "_tether/attach for session %q refused: %s", s.id, msg)
	case !lease.After(t.now()):
		err = refuse(errcode.CodeLeaseExpired, "_tether/attach returned lease_not_after %s, already passed", rfc3339(lease))
	case gen == 0:
		err = refuse(errcode.CodeNotAdmitted, "_tether/attach returned grant_generation 0")
	}
	if err != nil {
		we := err.(*errcode.Error)
		t.fenceLocked(s, we.Code, we.Message)
		return s.status(), err
	}
	s.conn, s.attached, s.fenced, s.bound = req.ConnID, true, false, true
	s.epoch++
	s.leaseMeta = bind.LeaseNotAfter
	s.notAfter = minTime(bind.LeaseNotAfter, lease)
	s.generation = gen
	s.code, s.message = "", ""
	return s.status(), nil
}

// fenceLocked detaches s. A session that was ever bound becomes Fenced; one
// that never bound stays Pending. Either way only an explicit reattach
// lifts it. Callers hold t.mu.
func (t *Table) fenceLocked(s *session, code errcode.Code, msg string) {
	s.attached = false
	s.fenced = s.bound
	s.epoch++
	s.code, s.message = code, msg
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
