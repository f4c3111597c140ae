package binding

import (
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// Authorize returns the grant a tool may act on for sessionID on connID, or
// the refusal: never asked to bind or unknown (not_admitted: plugin tools
// run only in a bound session), bind pending (rule 2), fenced (rule 6),
// attached on another connection (rule 4), or lease passed (rule 6: fences
// the binding).
func (t *Table) Authorize(connID, sessionID string) (Grant, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[sessionID]
	switch {
	case !ok:
		return Grant{}, refuse(errcode.CodeNotAdmitted, "session %q is unknown to the plugin", sessionID)
	case !s.intent:
		return Grant{}, refuse(errcode.CodeNotAdmitted, "session %q never asked to bind; the plugin's tools run only in a bound session", sessionID)
	case s.fenced:
		return Grant{}, refuse(errcode.CodeFenced, "session %q is fenced (%s: %s); reattach with session/load and _tether/attach", sessionID, s.code, s.message)
	case !s.attached:
		return Grant{}, refuse(errcode.CodeNotAdmitted, "session %q asked to bind but no bind has succeeded (%s: %s)", sessionID, s.code, s.message)
	case s.conn != connID:
		return Grant{}, refuse(errcode.CodeFenced, "session %q is attached on another ACP connection; this connection must reattach (session/load with the same tuple, then _tether/attach)", sessionID)
	}
	if err := t.expireLocked(s); err != nil {
		return Grant{}, err
	}
	return Grant{SessionID: s.id, Tuple: *s.tuple, TupleSHA256: s.tuple.SHA256(), NotAfter: s.notAfter, Epoch: s.epoch}, nil
}

// Check reports whether g is still the session's live grant: same epoch
// (no fence or reattach since), still attached, lease not passed. glob and
// grep call it after their work so that a binding lost in between turns
// the result into a failure, never a partial success.
func (t *Table) Check(g Grant) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[g.SessionID]
	switch {
	case !ok:
		return refuse(errcode.CodeNotAdmitted, "session %q vanished", g.SessionID)
	case s.epoch != g.Epoch || !s.attached:
		return refuse(errcode.CodeFenced, "session %q lost its binding during the call (%s: %s)", g.SessionID, s.code, s.message)
	}
	return t.expireLocked(s)
}

// Fence fences the binding g was issued for, if it is still that binding
// (a later reattach is not undone by a stale failure). Sticky: only an
// explicit reattach lifts it (rule 6).
func (t *Table) Fence(g Grant, code errcode.Code, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.sessions[g.SessionID]; ok && s.epoch == g.Epoch && s.attached {
		t.fenceLocked(s, code, msg)
	}
}

// Disconnect fences every binding attached on connID: the transport is
// gone (rule 6), and any later connection must reattach (rule 4).
func (t *Table) Disconnect(connID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.sessions {
		if s.conn == connID && s.attached {
			t.fenceLocked(s, errcode.CodeFenced, "ACP connection "+connID+" closed: transport lost")
		}
	}
}

// Policy decides whether the host may run one of its own tools for the
// session (rule 7). Tools that touch neither host files nor processes are
// always allowed. Filesystem and process tools are allowed only in a
// session that never asked to bind and lives on connID; an unknown session
// is refused, so a host that forgets to report a session fails closed.
func (t *Table) Policy(connID, sessionID string, kind contract.HostToolKind) error {
	switch kind {
	case contract.HostOther:
		return nil
	case contract.HostFilesystem, contract.HostProcess:
	default:
		return refuse(errcode.CodeInvalid, "host tool kind %d is not filesystem, process or other", kind)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[sessionID]
	switch {
	case !ok:
		return refuse(errcode.CodeNotAdmitted, "session %q is unknown to the plugin; hosts report session/new and session/load through OpenSession first", sessionID)
	case s.intent:
		return refuse(errcode.CodeDenied, "session %q is in a bound scope (%s): the host's own filesystem and process tools are refused", sessionID, s.state())
	case s.conn != connID:
		return refuse(errcode.CodeDenied, "session %q lives on another ACP connection", sessionID)
	}
	return nil
}
