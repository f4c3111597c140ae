package binding

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tetherdev/tether/admission"
)

// ErrBind: a session could not be bound (the receiver refused the tuple,
// or the agent answered with another session).
var ErrBind = errors.New("custodian: bind failed")

// Table is one ACP connection's binding table: session id -> session. A
// session/new in flight has no id yet; its bind waits in pending until the
// agent's `_tether/attach` (sent while the agent handles session/new)
// claims it by tuple digest, and the session/new result confirms the id.
// It counts the refusals of sessions not bound on its connection.
type Table struct {
	k       *Keeper
	unbound *tally

	mu       sync.Mutex
	sessions map[string]*Session
	pending  []*Pending
}

// Pending is the bind of a session/new in flight (AddPending).
type Pending struct {
	s       *Session
	claimed string // session id an attach claimed it for
}

// NewTable returns an empty table of one connection. End must be called.
func (k *Keeper) NewTable() *Table {
	return &Table{k: k, unbound: k.newTally("", "", ""), sessions: map[string]*Session{}}
}

// Get returns the session bound as sessionID, or nil.
func (t *Table) Get(sessionID string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[sessionID]
}

// All returns every bound session.
func (t *Table) All() []*Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Session, 0, len(t.sessions))
	for _, s := range t.sessions {
		out = append(out, s)
	}
	return out
}

// AddPending registers the bind of a session/new about to be sent; local
// makes its Session.Local.
func (t *Table) AddPending(b Spec, local func(*Session) any) *Pending {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &Pending{s: newSession("", b, local)}
	t.pending = append(t.pending, p)
	return p
}

// forAttach returns the session an attach for sessionID concerns: the
// session's, or an unclaimed pending bind with that tuple digest, which
// the attach then claims for sessionID.
func (t *Table) forAttach(sessionID, digest string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.sessions[sessionID]; ok {
		return s
	}
	for _, p := range t.pending {
		if p.claimed == "" && p.s.Digest == digest {
			p.claimed = sessionID
			p.s.id = sessionID
			t.sessions[sessionID] = p.s
			return p.s
		}
	}
	return nil
}

// ConfirmNew settles a pending bind with session/new's answer. The agent
// must answer with the session id its attach claimed, if any.
func (t *Table) ConfirmNew(p *Pending, sessionID string, failed bool) (*Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropPendingLocked(p)
	switch {
	case failed:
		if p.claimed != "" && t.sessions[p.claimed] == p.s {
			delete(t.sessions, p.claimed)
		}
		return nil, nil
	case p.claimed != "" && p.claimed != sessionID:
		delete(t.sessions, p.claimed)
		return nil, fmt.Errorf("%w: the agent attached session %q but session/new answered %q", ErrBind, p.claimed, sessionID)
	case p.claimed == "":
		if _, taken := t.sessions[sessionID]; taken {
			return nil, fmt.Errorf("%w: session/new answered %q, which is already bound on this connection", ErrBind, sessionID)
		}
		p.s.id = sessionID
		t.sessions[sessionID] = p.s
	}
	return p.s, nil
}

func (t *Table) dropPendingLocked(p *Pending) {
	for i, q := range t.pending {
		if q == p {
			t.pending = append(t.pending[:i], t.pending[i+1:]...)
			return
		}
	}
}

// AddLoad binds sessionID for a session/load; local makes a new row's
// Session.Local. A session already bound on this connection keeps its
// tuple (a different one is refused) and takes a later lease; either way
// it must reattach before anything runs.
func (t *Table) AddLoad(sessionID string, b Spec, local func(*Session) any) (s *Session, created bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.sessions[sessionID]; ok {
		if !cur.Tuple.Equal(b.Tuple) {
			return nil, false, fmt.Errorf("%w: session %q is bound to tuple %s; %w", ErrBind, sessionID, cur.Digest, admission.ErrTupleChanged)
		}
		if b.LeaseNotAfter.After(cur.Lease()) {
			if err := cur.Extend(b.LeaseNotAfter); err != nil {
				return nil, false, err
			}
		}
		cur.reload()
		return cur, false, nil
	}
	ns := newSession(sessionID, b, local)
	t.sessions[sessionID] = ns
	return ns, true, nil
}

// Remove forgets s, bound as sessionID.
func (t *Table) Remove(sessionID string, s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[sessionID] == s {
		delete(t.sessions, sessionID)
	}
}
