package binding

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetherdev/tether/custodian/audit"
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
	pending  []*pendingBind
}

// pendingBind is the bind of a session/new in flight (addPending): its row
// is made when an attach claims it or session/new answers its id.
type pendingBind struct {
	spec    Spec
	digest  string
	local   func(*Session) any
	claimed *Session // the row an attach made for it
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

// addPending registers the bind of a session/new about to be sent; local
// makes its row's Session.Local.
func (t *Table) addPending(b Spec, local func(*Session) any) *pendingBind {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &pendingBind{spec: b, digest: b.Tuple.SHA256(), local: local}
	t.pending = append(t.pending, p)
	return p
}

// forAttach returns the session an attach for sessionID concerns: the
// session's, or the row of an unclaimed pending bind with that tuple
// digest, which the attach then claims for sessionID.
func (t *Table) forAttach(sessionID, digest string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.sessions[sessionID]; ok {
		return s
	}
	for _, p := range t.pending {
		if p.claimed == nil && p.digest == digest {
			p.claimed = newSession(sessionID, p.spec, p.local)
			t.sessions[sessionID] = p.claimed
			return p.claimed
		}
	}
	return nil
}

// confirmNew settles a pending bind with session/new's answer. The agent
// must answer with the session id its attach claimed, if any.
func (t *Table) confirmNew(p *pendingBind, sessionID string, failed bool) (*Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropPendingLocked(p)
	switch {
	case failed:
		if p.claimed != nil && t.sessions[p.claimed.ID] == p.claimed {
			delete(t.sessions, p.claimed.ID)
		}
		return nil, nil
	case p.claimed != nil && p.claimed.ID != sessionID:
		delete(t.sessions, p.claimed.ID)
		return nil, fmt.Errorf("%w: the agent attached session %q but session/new answered %q", ErrBind, p.claimed.ID, sessionID)
	case p.claimed == nil:
		if _, taken := t.sessions[sessionID]; taken {
			return nil, fmt.Errorf("%w: session/new answered %q, which is already bound on this connection", ErrBind, sessionID)
		}
		p.claimed = newSession(sessionID, p.spec, p.local)
		t.sessions[sessionID] = p.claimed
	}
	return p.claimed, nil
}

func (t *Table) dropPendingLocked(p *pendingBind) {
	for i, q := range t.pending {
		if q == p {
			t.pending = append(t.pending[:i], t.pending[i+1:]...)
			return
		}
	}
}

// addLoad binds sessionID for a session/load; local makes a new row's
// Session.Local. A session already bound on this connection keeps its
// tuple (a different one is refused) and takes a later lease; either way
// it must reattach before anything runs.
func (t *Table) addLoad(sessionID string, b Spec, local func(*Session) any) (s *Session, created bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.sessions[sessionID]; ok {
		if err := cur.reload(b); err != nil {
			return nil, false, err
		}
		return cur, false, nil
	}
	ns := newSession(sessionID, b, local)
	t.sessions[sessionID] = ns
	return ns, true, nil
}

// remove forgets s, bound as sessionID.
func (t *Table) remove(sessionID string, s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[sessionID] == s {
		delete(t.sessions, sessionID)
	}
}

// New binds a session/new: the bind waits in pending while send sends
// session/new (once) and returns the agent's session id; the agent's
// attach may claim it meanwhile. Then the bind is recorded, the session
// claimed in the fleet's op store (only the claim waits out an
// unavailable op store: session/new is not repeated, the agent would make
// another session) and, for a plain agent, attached by the custodian. On
// an error after session/new succeeded the session stays bound,
// awaiting attach, and the error names the check.
func (t *Table) New(ctx context.Context, b Spec, local func(*Session) any, send func(context.Context) (string, error)) error {
	p := t.addPending(b, local)
	sessionID, err := send(ctx)
	s, cerr := t.confirmNew(p, sessionID, err != nil)
	if err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	t.auditBind(s)
	if err := t.k.h.Claim(ctx, s); err != nil {
		return fmt.Errorf("%w: session %s: %w", ErrBind, s.ID, err)
	}
	return t.attachPlain(ctx, s)
}

// Load binds sessionID for a session/load and sends it with send, once.
// A load of a session already bound may extend its lease: the keys it
// dispatched are kept for the lease as extended, recorded first
// (Hooks.KeepForLease). The claim (and its waiting) comes before
// session/load reaches the agent: a session another custodian owns is
// not loaded. A session this load bound is forgotten again when the claim
// or send fails.
func (t *Table) Load(ctx context.Context, sessionID string, b Spec, local func(*Session) any, send func(context.Context) error) error {
	if err := t.k.h.KeepForLease(ctx, b.Tuple.SHA256(), b.LeaseNotAfter, true); err != nil {
		return err
	}
	s, created, err := t.addLoad(sessionID, b, local)
	if err != nil {
		return err
	}
	if err := t.k.h.Claim(ctx, s); err != nil {
		if created {
			t.remove(sessionID, s)
		}
		return fmt.Errorf("%w: session %s: %w", ErrBind, sessionID, err)
	}
	if err := send(ctx); err != nil {
		if created {
			t.remove(sessionID, s)
		}
		return err
	}
	t.auditBind(s)
	return t.attachPlain(ctx, s)
}

// ExtendLease applies a same-tuple lease extension to bound session
// sessionID. The later lease end is first recorded durably
// (Hooks.KeepForLease, without waiting), so the keys the session already
// dispatched are kept until it ends plus the retention; if that record
// fails, the lease is not extended.
func (t *Table) ExtendLease(ctx context.Context, sessionID string, notAfter time.Time) error {
	s := t.Get(sessionID)
	if s == nil {
		return fmt.Errorf("%w: session %q is not bound", ErrBind, sessionID)
	}
	if err := t.k.h.KeepForLease(ctx, s.Digest, notAfter, false); err != nil {
		return err
	}
	if err := s.extend(notAfter); err != nil {
		return err
	}
	na := notAfter.UTC()
	t.k.h.Audit(audit.Record{Kind: audit.KindLease, SessionID: sessionID, TupleSHA256: s.Digest,
		Principal: s.Principal, LeaseNotAfter: &na})
	return nil
}

// auditBind records that s is bound.
func (t *Table) auditBind(s *Session) {
	lease := s.Lease()
	t.k.h.Audit(audit.Record{Kind: audit.KindBind, SessionID: s.ID, TupleSHA256: s.Digest,
		Principal: s.Principal, LeaseNotAfter: &lease})
}

// attachPlain attaches a plain agent's freshly bound session before
// anything else is sent to the agent (its first prompt); a tether agent
// attaches by itself. A failure leaves the session awaiting attach and is
// returned, naming the check.
func (t *Table) attachPlain(ctx context.Context, s *Session) error {
	if !s.Plain {
		return nil
	}
	if err := t.selfAttach(ctx, s); err != nil {
		return fmt.Errorf("%w: the custodian's attach for plain session %s: %w", ErrBind, s.ID, err)
	}
	return nil
}

// Release forgets s and ends its life, in this order: release (the
// embedder's: the session's terminals released on the receiver), its
// refusals written, then after (the embedder's own records).
func (t *Table) Release(s *Session, release, after func()) {
	t.remove(s.ID, s)
	release()
	s.endTally()
	after()
}

// End ends the table with its connection: every session is released as
// Release does, all at once, then the refusals of sessions not bound
// here are written.
func (t *Table) End(release, after func(*Session)) {
	var wg sync.WaitGroup
	for _, s := range t.All() {
		t.remove(s.ID, s)
		wg.Go(func() {
			release(s)
			s.endTally()
			after(s)
		})
	}
	wg.Wait()
	t.unbound.end()
}
