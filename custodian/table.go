package custodian

import (
	"fmt"
	"sync"

	"github.com/tetherdev/tether/admission"
)

// table is one ACP connection's binding table: session id -> binding. A
// session/new in flight has no id yet; its bind waits in pending until the
// agent's `_tether/attach` (sent while the agent handles session/new)
// claims it by tuple digest, and the session/new result confirms the id.
type table struct {
	mu       sync.Mutex
	sessions map[string]*binding
	pending  []*pendingBind
}

type pendingBind struct {
	b       *binding
	claimed string // session id an attach claimed it for
}

func newTable() *table { return &table{sessions: map[string]*binding{}} }

func (t *table) get(sessionID string) *binding {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[sessionID]
}

func (t *table) all() []*binding {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*binding, 0, len(t.sessions))
	for _, b := range t.sessions {
		out = append(out, b)
	}
	return out
}

// addPending registers the bind of a session/new about to be sent.
func (t *table) addPending(b Binding) *pendingBind {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &pendingBind{b: newBinding("", b)}
	t.pending = append(t.pending, p)
	return p
}

// forAttach returns the binding an attach for sessionID concerns: the
// session's, or an unclaimed pending bind with that tuple digest, which
// the attach then claims for sessionID.
func (t *table) forAttach(sessionID, digest string) *binding {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b, ok := t.sessions[sessionID]; ok {
		return b
	}
	for _, p := range t.pending {
		if p.claimed == "" && p.b.digest == digest {
			p.claimed = sessionID
			p.b.sessionID = sessionID
			t.sessions[sessionID] = p.b
			return p.b
		}
	}
	return nil
}

// confirmNew settles a pending bind with session/new's answer. The agent
// must answer with the session id its attach claimed, if any.
func (t *table) confirmNew(p *pendingBind, sessionID string, failed bool) (*binding, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropPendingLocked(p)
	switch {
	case failed:
		if p.claimed != "" && t.sessions[p.claimed] == p.b {
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
		p.b.sessionID = sessionID
		t.sessions[sessionID] = p.b
	}
	return p.b, nil
}

func (t *table) dropPendingLocked(p *pendingBind) {
	for i, q := range t.pending {
		if q == p {
			t.pending = append(t.pending[:i], t.pending[i+1:]...)
			return
		}
	}
}

// addLoad binds sessionID for a session/load. A session already bound on
// this connection keeps its tuple (a different one is refused) and takes
// a later lease; either way it must reattach before anything runs.
func (t *table) addLoad(sessionID string, b Binding) (bnd *binding, created bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.sessions[sessionID]; ok {
		if !cur.Tuple.Equal(b.Tuple) {
			return nil, false, fmt.Errorf("%w: session %q is bound to tuple %s; %w", ErrBind, sessionID, cur.digest, admission.ErrTupleChanged)
		}
		if b.LeaseNotAfter.After(cur.lease()) {
			if err := cur.extend(b.LeaseNotAfter); err != nil {
				return nil, false, err
			}
		}
		cur.mu.Lock()
		if cur.state == stateActive {
			cur.state = stateAwaitAttach
		}
		cur.mu.Unlock()
		return cur, false, nil
	}
	nb := newBinding(sessionID, b)
	t.sessions[sessionID] = nb
	return nb, true, nil
}

// remove forgets a binding.
func (t *table) remove(sessionID string, b *binding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[sessionID] == b {
		delete(t.sessions, sessionID)
	}
}
