package binding

import (
	"context"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
)

// Call is one callback that passed its binding checks: what to send it
// on (the session, the attach's epoch) and under which tag and deadline.
type Call struct {
	Session  *Session
	Epoch    uint64
	Method   string
	Op       acpmeta.Op
	TaggedBy string // TaggedByCustodian when the custodian minted Op
	Deadline time.Time

	k *Keeper
}

// Admit is the one decision on an fs/* or terminal/* callback before
// anything is sent: the session is bound on this connection (else
// not_admitted); `_meta["tether/op"]` is present and names the binding's
// tuple digest (else tuple_mismatch, and the binding is fenced); the
// binding is attached, on the live connection, within its lease (else
// fenced or lease_expired); and the deadline, min(the request's, the
// command budget, the lease's end), has not passed (else timeout or
// lease_expired). For a plain agent's binding a missing tag is minted
// here (tagOf) and a binding awaiting attach, or fenced by a transport
// loss, is attached by the custodian itself. Every refusal is counted.
func (t *Table) Admit(ctx context.Context, method, sessionID string, meta map[string]any) (*Call, error) {
	s := t.Get(sessionID)
	if s == nil {
		t.Refused(nil, errcode.CodeNotAdmitted, audit.RefusalEvent{Method: method})
		return nil, acperr.NewError(errcode.CodeNotAdmitted, "session %q is not bound on this connection", sessionID)
	}
	op, taggedBy, err := t.tagOf(s, method, meta)
	if err != nil {
		return nil, err
	}
	k := t.k
	cl := &Call{k: k, Session: s, Method: method, Op: op, TaggedBy: taggedBy}
	now := k.h.Now()
	epoch, lease, err := s.usable(now)
	if err != nil && s.Plain && s.selfAttachable() {
		if aerr := t.selfAttach(ctx, s); aerr == nil {
			epoch, lease, err = s.usable(now)
		}
	}
	if err != nil {
		return nil, cl.Refused(err)
	}
	deadline, err := k.deadline(now, op.Deadline, lease)
	if err != nil {
		return nil, cl.Refused(err)
	}
	cl.Epoch, cl.Deadline = epoch, deadline
	return cl, nil
}

// usable returns the epoch to dispatch on and the lease's end, or the
// refusal.
func (s *Session) usable(now time.Time) (uint64, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case StateAwaitAttach:
		return 0, time.Time{}, acperr.NewError(errcode.CodeFenced,
			"session %s is bound but not attached; call %s first", s.ID, acpmeta.MethodAttach)
	case StateFenced:
		if s.fenceCode == CodeRefusalBudget {
			return 0, time.Time{}, acperr.NewError(errcode.CodeFenced, "session %s is fenced for good (%s: %s); start a new session",
				s.ID, s.fenceCode, s.fenceWhy)
		}
		return 0, time.Time{}, acperr.NewError(errcode.CodeFenced, "session %s is fenced (%s: %s); reattach with %s",
			s.ID, s.fenceCode, s.fenceWhy, acpmeta.MethodAttach)
	}
	if !now.Before(s.lease) {
		return 0, time.Time{}, acperr.NewError(errcode.CodeLeaseExpired, "session %s: lease ended at %s",
			s.ID, s.lease.UTC().Format(time.RFC3339))
	}
	return s.epoch, s.lease, nil
}

// selfAttachable reports whether the custodian may attach a plain agent's
// binding itself: it awaits its first attach, or was fenced by a transport
// loss. A binding fenced because a callback named another tuple is not:
// only an explicit `_tether/attach` lifts that fence.
func (s *Session) selfAttachable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == StateAwaitAttach || s.state == StateFenced && s.fenceCode == errcode.CodeFateUnknown
}

// tagOf returns the callback's op tag: the agent's own, checked against
// the binding (a wrong digest fences), or, for a plain agent's callback
// with no tag at all, one the custodian mints: the binding's digest, a
// fresh op key, no deadline of its own (the command budget and the lease
// bound it).
func (t *Table) tagOf(s *Session, method string, meta map[string]any) (acpmeta.Op, string, error) {
	if _, present := meta[acpmeta.KeyOp]; !present && s.Plain {
		return acpmeta.Op{TupleSHA256: s.Digest, OpKey: NewKey("plain")}, TaggedByCustodian, nil
	}
	op, err := acpmeta.OpFromMeta(meta)
	if err != nil && !sameDigest(meta, s.Digest) {
		return acpmeta.Op{}, "", t.mismatch(s, method, "%s: %v", acpmeta.KeyOp, err)
	}
	if err != nil {
		t.Refused(s, errcode.CodeInvalid, audit.RefusalEvent{Method: method})
		return acpmeta.Op{}, "", acperr.NewError(errcode.CodeInvalid, "%v", err)
	}
	if op.TupleSHA256 != s.Digest {
		return acpmeta.Op{}, "", t.mismatch(s, method, "%s names tuple_sha256 %s, the session is bound to %s",
			acpmeta.KeyOp, op.TupleSHA256, s.Digest)
	}
	return op, "", nil
}

// Refused counts a refusal of cl before anything was sent and returns err.
func (cl *Call) Refused(err error) error {
	code, _ := acperr.CodeOf(err)
	cl.Refuse(code)
	return err
}

// Refuse counts that cl was refused with code before anything was sent.
func (cl *Call) Refuse(code errcode.Code) {
	cl.k.refusedBound(cl.Session, code, audit.RefusalEvent{Method: cl.Method, OpKey: cl.Op.OpKey, TaggedBy: cl.TaggedBy})
}

// mismatch refuses a callback whose op tag does not name the binding's
// tuple and fences the binding: the agent side disagrees about what this
// session is bound to, so nothing more runs until it reattaches.
func (t *Table) mismatch(s *Session, method, format string, args ...any) error {
	t.Refused(s, errcode.CodeTupleMismatch, audit.RefusalEvent{Method: method})
	if s.fence(errcode.CodeTupleMismatch, "a callback named another tuple") {
		t.k.auditFence(s, errcode.CodeTupleMismatch)
	}
	return acperr.NewError(errcode.CodeTupleMismatch, format, args...)
}

// sameDigest reports whether a malformed op tag still names digest, so a
// bad op key or deadline is refused as invalid without fencing.
func sameDigest(meta map[string]any, digest string) bool {
	m, ok := meta[acpmeta.KeyOp].(map[string]any)
	if !ok {
		return false
	}
	d, ok := m["tuple_sha256"].(string)
	return ok && d == digest
}

// deadline is min(the request's deadline, now + the command budget, the
// lease's end); a deadline already passed is refused before dispatch. A
// zero requested deadline (a tag the custodian minted) leaves the budget
// and the lease.
func (k *Keeper) deadline(now, requested, lease time.Time) (time.Time, error) {
	d := now.Add(k.cfg.CommandBudget)
	if !requested.IsZero() && requested.Before(d) {
		d = requested
	}
	if lease.Before(d) {
		d = lease
	}
	if !d.After(now) {
		if !lease.After(now) {
			return time.Time{}, acperr.NewError(errcode.CodeLeaseExpired, "lease ended at %s", lease.UTC().Format(time.RFC3339))
		}
		return time.Time{}, acperr.NewError(errcode.CodeTimeout, "request deadline %s has passed",
			requested.UTC().Format(time.RFC3339Nano))
	}
	return d, nil
}
