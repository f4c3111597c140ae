package custodian

import (
	"context"
	"time"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/acpmeta"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
)

// admit runs the checks every fs/* and terminal/* callback passes before
// anything is sent: the session is bound on this connection (else
// not_admitted); `_meta["tether/op"]` is present and names the binding's
// tuple digest (else tuple_mismatch, and the binding is fenced); the
// binding is attached, on the live connection, within its lease (else
// fenced or lease_expired); and the deadline, min(the request's, the
// command budget, the lease's end), has not passed. For a plain agent's
// binding a missing tag is minted by the custodian (tagOf) and a binding
// awaiting attach, or fenced by a transport loss, is attached by the
// custodian itself (selfAttach).
func (h *client) admit(ctx context.Context, method, sessionID string, meta map[string]any) (*call, error) {
	c := h.c
	b := h.conn.table.get(sessionID)
	if b == nil {
		h.conn.auditRefusal(nil, method, "", errcode.CodeNotAdmitted)
		return nil, acperr.NewError(errcode.CodeNotAdmitted, "session %q is not bound on this connection", sessionID)
	}
	op, taggedBy, err := h.tagOf(b, method, meta)
	if err != nil {
		return nil, err
	}
	cl := &call{c: c, b: b, method: method, op: op, taggedBy: taggedBy}
	now := c.now()
	epoch, err := b.usable(now)
	if err != nil && b.Plain && b.selfAttachable() {
		if aerr := h.conn.selfAttach(ctx, b); aerr == nil {
			epoch, err = b.usable(now)
		}
	}
	if err != nil {
		return nil, cl.refused(err)
	}
	deadline, err := c.deadline(now, op.Deadline, b.lease())
	if err != nil {
		return nil, cl.refused(err)
	}
	cl.epoch, cl.deadline = epoch, deadline
	return cl, nil
}

// TaggedByCustodian is the tagged_by of receipts and audit records of a
// plain agent's callback whose op tag the custodian minted.
const TaggedByCustodian = "custodian"

// tagOf returns the callback's op tag: the agent's own, checked against
// the binding (a wrong digest fences), or, for a plain agent's callback
// with no tag at all, one the custodian mints: the binding's digest, a
// fresh op key, no deadline of its own (the command budget and the lease
// bound it).
func (h *client) tagOf(b *binding, method string, meta map[string]any) (acpmeta.Op, string, error) {
	if _, present := meta[acpmeta.KeyOp]; !present && b.Plain {
		return acpmeta.Op{TupleSHA256: b.digest, OpKey: newKey("plain")}, TaggedByCustodian, nil
	}
	op, err := acpmeta.OpFromMeta(meta)
	if err != nil && !sameDigest(meta, b.digest) {
		return acpmeta.Op{}, "", h.mismatch(b, method, "%s: %v", acpmeta.KeyOp, err)
	}
	if err != nil {
		h.conn.auditRefusal(b, method, "", errcode.CodeInvalid)
		return acpmeta.Op{}, "", acperr.NewError(errcode.CodeInvalid, "%v", err)
	}
	if op.TupleSHA256 != b.digest {
		return acpmeta.Op{}, "", h.mismatch(b, method, "%s names tuple_sha256 %s, the session is bound to %s",
			acpmeta.KeyOp, op.TupleSHA256, b.digest)
	}
	return op, "", nil
}

// refused audits a refusal of cl before anything was sent and returns it.
func (cl *call) refused(err error) error {
	code, _ := acperr.CodeOf(err)
	cl.refuse(code)
	return err
}

// refuse counts that cl was refused with code before anything was sent
// (refusals.go).
func (cl *call) refuse(code errcode.Code) {
	cl.c.refusedBound(cl.b, code, audit.RefusalEvent{Method: cl.method, OpKey: cl.op.OpKey, TaggedBy: cl.taggedBy})
}

// mismatch refuses a callback whose op tag does not name the binding's
// tuple and fences the binding: the agent side disagrees about what this
// session is bound to, so nothing more runs until it reattaches.
func (h *client) mismatch(b *binding, method, format string, args ...any) error {
	h.conn.auditRefusal(b, method, "", errcode.CodeTupleMismatch)
	if b.fence(errcode.CodeTupleMismatch, "a callback named another tuple") {
		h.c.auditFence(b, errcode.CodeTupleMismatch)
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
func (c *Custodian) deadline(now, requested, lease time.Time) (time.Time, error) {
	d := now.Add(c.opts.CommandBudget)
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

// auditRefusal counts a callback refused before anything was sent: for
// its session b, or, b nil, for the sessions not bound on cn.
func (cn *Conn) auditRefusal(b *binding, method, opKey string, code errcode.Code) {
	cn.refused(b, code, audit.RefusalEvent{Method: method, OpKey: opKey})
}

// auditFence records that a binding was fenced.
func (c *Custodian) auditFence(b *binding, code errcode.Code) {
	c.audit(audit.Record{Kind: audit.KindFence, SessionID: b.sessionID, TupleSHA256: b.digest,
		Principal: b.Principal, Code: string(code)})
}
